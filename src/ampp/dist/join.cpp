#include <ampp/dist/join.h>

#include <c10/util/Exception.h>

#include <algorithm>

#include "log_format.h"

namespace ampp::dist {
namespace {

// Join mode off again however the loop ends (an exception leaves the other ranks to their timeout,
// as in PyTorch).
class JoinModeGuard {
 public:
  JoinModeGuard(const std::vector<Joinable*>& joinables, const JoinOptions& options) : joinables_(joinables) {
    for (auto* j : joinables_) j->set_join_mode(&options);
  }
  ~JoinModeGuard() {
    for (auto* j : joinables_) j->set_join_mode(nullptr);
  }
  JoinModeGuard(const JoinModeGuard&) = delete;
  JoinModeGuard& operator=(const JoinModeGuard&) = delete;

 private:
  const std::vector<Joinable*>& joinables_;
};

constexpr int64_t kManyShadowedIterations = 1000;  // PyTorch warns at the same count

}  // namespace

void join(Joinable& joinable, const std::function<void()>& loop, const JoinOptions& options) {
  join(std::vector<Joinable*>{&joinable}, loop, options);
}

void join(const std::vector<Joinable*>& joinables, const std::function<void()>& loop, const JoinOptions& options) {
  TORCH_CHECK(!joinables.empty() && std::find(joinables.begin(), joinables.end(), nullptr) == joinables.end(),
              "ampp::dist::join: give at least one joinable and no null pointer");
  if (!options.enable()) {
    loop();
    return;
  }
  JoinModeGuard mode(joinables, options);
  loop();
  // Out of inputs: answer the others' iterations until nobody is active. Active in the last round
  // (the first shadow finds nobody active) means this rank holds the final model.
  bool active_to_the_end = true;
  for (int64_t shadowed = 0; joinables.front()->shadow_iteration() > 0; ++shadowed) {
    active_to_the_end = false;
    for (size_t i = 1; i < joinables.size(); ++i) joinables[i]->shadow_iteration();
    if (shadowed == kManyShadowedIterations)
      log_warning("ampp::dist::join: this rank has shadowed {} iterations of the others; the inputs are very uneven",
                  kManyShadowedIterations);
  }
  for (auto* j : joinables) j->finish_join(active_to_the_end);
}

}  // namespace ampp::dist
