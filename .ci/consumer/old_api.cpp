// Names of ampp 0.1 that 0.2 renamed: they still compile, each with a deprecation warning naming the new
// one (docs/changelog.md, the policy). CMakeLists.txt also compiles this file with
// -Werror=deprecated-declarations, which must fail: the warnings are there.
#include <ampp/ampp.h>

int old_api_still_compiles() {
  ampp::GradScaler scaler;
  ampp::GradScalerStateDict state = scaler.state_dict();
  scaler.load_state_dict(state);
  ampp::AmpStateDict amp_state = state;
  return amp_state.contains("scale") ? 1 : 0;
}
