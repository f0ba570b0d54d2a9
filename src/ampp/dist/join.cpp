#include <ampp/dist/join.h>

#include <ampp/dist/log.h>

namespace ampp::dist {
namespace {

// Join mode off again however the loop ends (an exception leaves the other ranks to their timeout,
// as in PyTorch).
class JoinModeGuard {
 public:
  JoinModeGuard(Joinable& joinable, const JoinOptions& options) : joinable_(joinable) {
    joinable_.set_join_mode(&options);
  }
  ~JoinModeGuard() { joinable_.set_join_mode(nullptr); }
  JoinModeGuard(const JoinModeGuard&) = delete;
  JoinModeGuard& operator=(const JoinModeGuard&) = delete;

 private:
  Joinable& joinable_;
};

constexpr int64_t kManyShadowedIterations = 1000;  // PyTorch warns at the same count

}  // namespace

void join(Joinable& joinable, const std::function<void()>& loop, const JoinOptions& options) {
  if (!options.enable()) {
    loop();
    return;
  }
  JoinModeGuard mode(joinable, options);
  loop();
  // Out of inputs: answer the others' iterations until nobody is active. Active in the last round
  // (the first shadow finds nobody active) means this rank holds the final model.
  bool active_to_the_end = true;
  for (int64_t shadowed = 0; joinable.shadow_iteration() > 0; ++shadowed) {
    active_to_the_end = false;
    if (shadowed == kManyShadowedIterations)
      log_warning("ampp::dist::join: this rank has shadowed {} iterations of the others; the inputs are very uneven",
                  kManyShadowedIterations);
  }
  joinable.finish_join(active_to_the_end);
}

}  // namespace ampp::dist
