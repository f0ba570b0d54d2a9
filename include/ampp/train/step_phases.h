#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Where a training step's wall time goes, per rank: `ampp train` always measures it (a few clock
// reads per step), writes it to summary.json and prints it under --profile, so that every speed
// claim about a configuration can be explained phase by phase.

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ampp::train {

// Disjoint phases that together cover the whole step loop.
enum class StepPhase {
  kData,           // the next batch: rows selected and standardised
  kForward,        // forward, loss, loss scaling
  kBackward,       // backward's computation (with DDP: less the wait below)
  kAllreduceWait,  // DDP: after the autograd graph finished, waiting for the buckets' allreduce
                   // (what overlap did not hide, and the time the slower rank takes to arrive)
  kOptimizer,      // overflow checks, unscale, clipping, optimizer step, master copies
  kBookkeeping,    // accuracy counts, metrics, progress, periodic checkpoints
};
inline constexpr size_t kNumStepPhases = 6;
const char* step_phase_name(StepPhase phase);

// Seconds per phase, summed over `steps` steps of one rank.
struct StepPhases {
  std::array<double, kNumStepPhases> seconds{};
  int64_t steps = 0;
  double& operator[](StepPhase p) { return seconds[static_cast<size_t>(p)]; }
  double operator[](StepPhase p) const { return seconds[static_cast<size_t>(p)]; }
  double total_seconds() const;
};

// A lap timer over a StepPhases: each lap charges the time since the previous lap to a phase.
class PhaseClock {
 public:
  explicit PhaseClock(StepPhases& into) : into_(into) {}
  void restart() { last_ = std::chrono::steady_clock::now(); }
  void lap(StepPhase phase);
  // Moves time already charged to `from` over to `to` (e.g. a wait measured inside a phase).
  void move(StepPhase from, StepPhase to, double seconds);

 private:
  StepPhases& into_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// The ranks side by side: ms per step and share of the step, one row per phase.
std::string step_phases_table(const std::vector<StepPhases>& per_rank);

}  // namespace ampp::train
