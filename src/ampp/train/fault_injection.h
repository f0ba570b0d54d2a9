#pragma once
// The seam through which a test binary changes a run: the recovery, stall and chaos tests (tests/train,
// scripts/chaos.py) and a GPU test's proof that a step reads nothing. It changes no choice of the product's:
// the CPU runs a GPU run's path through real options (--host-reads log-points, --fused-optimizer, --prefetch). The
// shipped `ampp` fills none: faults come only from a source that a test binary registers (tests/train's `ampp-faults`,
// which reads them from the environment: fault_injection_env.cpp there). Nothing in a file or the environment can reach
// them in the shipped library or CLI. What a fault does (a signal, a half-written file) is the test's own code, called
// at two points of the run; the library only calls it. Each field is off when empty.
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>

namespace ampp::train::detail {

struct FaultInjection {
  /// Called after each step with the run's global step (a test kills or stops the process there).
  std::function<void(int64_t global_step)> after_step;
  /// Called before each checkpoint this worker writes: its count (1-based), the step it holds, the temporary
  /// file the write goes through, and the file's bytes (a test writes half of them there and dies).
  std::function<void(int64_t nth, int64_t step, const std::string& temporary,
                     const std::function<std::string()>& bytes)>
      before_save;
  std::set<int64_t> inf_steps;  // this rank's loss is made inf at these steps
  bool error_on_sync = false;   // a GPU test: each step under c10's sync debug mode, set to error
};

using FaultSource = FaultInjection (*)(int rank, int world, bool restarted);

/// Registers the faults' source; a test binary calls it once, before training starts.
void set_fault_source(FaultSource source);

/// This worker's faults: none unless a test binary registered a source.
FaultInjection faults_for(int rank, int world, bool restarted);

}  // namespace ampp::train::detail
