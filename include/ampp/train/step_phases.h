#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Where a training step's wall time goes, per rank: `ampp train` always measures it (a few clock
// reads per step), writes it to summary.json and prints it under --profile, so that every speed
// claim about a configuration can be explained phase by phase.

#include <c10/core/Device.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
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
//
// On a GPU the host runs ahead of the device and waits only where it reads (Note [what the host reads],
// run.h): its own clock times the launches, and a read's wait lands in whatever phase comes next. There
// (use_device()) each lap records a timing event on the device's current stream instead, and settle(), at a
// read, where the host waits for the GPU anyway, charges each interval between two events, as the GPU ran
// it, to its phase. DDP's allreduce wait is then inside the backward phase's device time (the compute
// stream waits for the reduction there), and move() does nothing. Laps are not recorded while paused (a
// CUDA graph's capture and replay, whose work is charged to the phase of the lap after it).
class PhaseClock {
 public:
  explicit PhaseClock(StepPhases& into);
  ~PhaseClock();
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;
  void use_device(c10::Device device);
  void restart();
  void lap(StepPhase phase);
  // Moves time already charged to `from` over to `to` (e.g. a wait measured inside a phase); host clock only.
  void move(StepPhase from, StepPhase to, double seconds);
  // Device clock: waits for the last lap's event and charges the intervals recorded since the last settle().
  void settle();
  void pause(bool paused) { paused_ = paused; }

 private:
  struct DeviceLaps;  // the events (c10::Event), in step_phases.cpp
  StepPhases& into_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::unique_ptr<DeviceLaps> device_;
  bool paused_ = false;
};

// The ranks side by side: ms per step and share of the step, one row per phase.
std::string step_phases_table(const std::vector<StepPhases>& per_rank);

}  // namespace ampp::train
