#include <ampp/util/version.h>

namespace ampp {

#define AMPP_STRINGIFY_(x) #x
#define AMPP_STRINGIFY(x) AMPP_STRINGIFY_(x)

const char* version() {
  return AMPP_STRINGIFY(AMPP_VERSION_MAJOR) "." AMPP_STRINGIFY(AMPP_VERSION_MINOR) "." AMPP_STRINGIFY(
      AMPP_VERSION_PATCH);
}

}  // namespace ampp
