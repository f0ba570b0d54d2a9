#pragma once
// The launcher's side of heartbeats (ampp/dist/heartbeat.h): one file per local worker, and the
// check that names a stalled worker.
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ampp::dist::detail {

struct Stall {
  int local_index = -1;  // the worker to blame
  std::string cause;     // "made no progress for 30 s (step 17; the process is stopped ...)"
};

class StallWatch {
 public:
  // Creates a private folder with one heartbeat file per local worker; timeout 0 = never a stall.
  StallWatch(int workers, std::chrono::milliseconds timeout);
  ~StallWatch();
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // AMPP_HEARTBEAT_FILE for worker `index`.
  std::string file(int index) const;
  // " (last reported step S)" for worker `index`, or "" when it never reported (or no watch).
  std::string last_step_text(int index) const;
  // Empties the files (a new attempt starts unwatched until its workers report).
  void reset();
  // At most once a second: a stall when some reporting worker has been silent for the timeout.
  // The one blamed is the worker that got least far (a worker that never reported counts as
  // furthest behind); among those, one the kernel shows stopped (SIGSTOP) or running while the
  // others wait.
  std::optional<Stall> check(const std::vector<pid_t>& pids);

 private:
  std::string dir_;
  int workers_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point last_check_{};
};

}  // namespace ampp::dist::detail
