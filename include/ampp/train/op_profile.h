#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Which operators a window of training steps spent its time in, from LibTorch's own profiler (the one
// behind Python's torch.profiler): `ampp train --profile` records steps on rank 0 and prints the top
// operators by self time beside the step phases, so that a phase's milliseconds explain themselves.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ampp::train {

// One operator (aten op, autograd node or user scope), summed over the recorded steps of one rank.
struct OpTime {
  std::string name;
  int64_t calls = 0;
  double self_ms = 0;   // its own time, without the operators it called
  double total_ms = 0;  // with them (nested calls of the same name counted once each)
};

struct OpProfile {
  int64_t steps = 0;        // steps recorded
  double recorded_ms = 0;   // wall time of the recorded window
  std::vector<OpTime> ops;  // by self time, largest first
};

// Records the operators LibTorch runs on this process between start() and stop() (every thread).
// One at a time per process: start() throws while LibTorch's profiler is already on.
class OpRecorder {
 public:
  OpRecorder();
  ~OpRecorder();  // stops a recording still running, discarding it
  OpRecorder(const OpRecorder&) = delete;
  OpRecorder& operator=(const OpRecorder&) = delete;
  void start();
  bool recording() const { return recording_; }
  // The operators since start(), over `steps` steps.
  OpProfile stop(int64_t steps);

 private:
  bool recording_ = false;
  int64_t started_ns_ = 0;
};

// The `top` operators by self time: calls and ms per step, share of the recorded time.
std::string op_table(const OpProfile& profile, size_t top = 15);

}  // namespace ampp::train
