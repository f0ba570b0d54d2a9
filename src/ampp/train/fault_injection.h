#pragma once
// Fault injection for the recovery, stall and chaos tests (tests/train, scripts/chaos.py). The shipped
// `ampp` has none: faults come only from a source that a test binary registers (tests/train's
// `ampp-faults`, which reads them from the environment: fault_injection_env.cpp there). Nothing in a
// file or the environment can reach them in the shipped library or CLI. Each field is off when empty.
#include <cstdint>
#include <optional>
#include <set>

namespace ampp::train::detail {

struct FaultInjection {
  std::optional<int64_t> kill_at_step;  // the last rank SIGKILLs itself after this step
  std::optional<int64_t> stop_at_step;  // the last rank SIGSTOPs itself after this step
  std::set<int64_t> inf_steps;          // this rank's loss is made inf at these steps
  std::optional<int64_t> kill_in_save;  // rank 0 dies halfway through writing its N-th checkpoint (1-based)
  // TrainOptions::cuda_graphs on the CPU: its step path, run eagerly, with the host reading the steps'
  // results only where a GPU run reads them (every log_every steps), not after every step.
  bool uncaptured_graph_step = false;
  bool error_on_sync = false;  // a GPU test: each step under c10's sync debug mode, set to error
  // The CPU runs the step as a GPU run does: ampp::FusedSGD, and the host reading the steps' results every
  // log_every steps (a test counts the host reads of a run).
  bool gpu_step_on_cpu = false;
  bool prefetch_on_cpu = false;  // TrainOptions::prefetch_batches's loader thread on the CPU too
};

using FaultSource = FaultInjection (*)(int rank, int world, bool restarted);

/// Registers the faults' source; a test binary calls it once, before training starts.
void set_fault_source(FaultSource source);

/// This worker's faults: none unless a test binary registered a source.
FaultInjection faults_for(int rank, int world, bool restarted);

}  // namespace ampp::train::detail
