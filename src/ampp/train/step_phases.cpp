#include <ampp/train/step_phases.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <numeric>
#include <optional>
#include <utility>

#include "report_json.h"

namespace ampp::train {

namespace {
constexpr std::array<StepPhase, kNumStepPhases> kPhases{StepPhase::kData,      StepPhase::kForward,
                                                        StepPhase::kBackward,  StepPhase::kAllreduceWait,
                                                        StepPhase::kOptimizer, StepPhase::kBookkeeping};

double ms_per_step(const StepPhases& p, double seconds) { return p.steps > 0 ? seconds * 1e3 / p.steps : 0.0; }
}  // namespace

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::kData:
      return "data";
    case StepPhase::kForward:
      return "forward";
    case StepPhase::kBackward:
      return "backward";
    case StepPhase::kAllreduceWait:
      return "allreduce_wait";
    case StepPhase::kOptimizer:
      return "optimizer";
    case StepPhase::kBookkeeping:
      return "bookkeeping";
  }
  TORCH_CHECK(false, "unknown StepPhase ", static_cast<int>(phase));
}

double StepPhases::total_seconds() const { return std::accumulate(seconds.begin(), seconds.end(), 0.0); }

// The device clock's events: the one intervals are measured from, and the laps since the last settle().
struct PhaseClock::DeviceLaps {
  explicit DeviceLaps(c10::Device d) : device(d) {}
  c10::Device device;
  std::optional<c10::Event> from;
  std::vector<std::pair<StepPhase, c10::Event>> laps;

  c10::Event recorded() const {
    c10::Event event(device.type(), c10::EventFlag::BACKEND_DEFAULT);  // timing on
    event.record(c10::impl::getDeviceGuardImpl(device.type())->getStream(device));
    return event;
  }
};

PhaseClock::PhaseClock(StepPhases& into) : into_(into) {}
PhaseClock::~PhaseClock() = default;

void PhaseClock::use_device(c10::Device device) {
  device_ = std::make_unique<DeviceLaps>(device);
  restart();
}

void PhaseClock::restart() {
  last_ = std::chrono::steady_clock::now();
  if (!device_) return;
  settle();  // between epochs: what was recorded is charged, the evaluation after it is not
  device_->from = device_->recorded();
}

void PhaseClock::lap(StepPhase phase) {
  if (paused_) return;
  if (device_) {
    device_->laps.emplace_back(phase, device_->recorded());
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  into_[phase] += std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

void PhaseClock::move(StepPhase from, StepPhase to, double seconds) {
  if (device_) return;  // the device's time has the wait where it happened
  into_[from] -= seconds;
  into_[to] += seconds;
}

void PhaseClock::settle() {
  if (!device_ || device_->laps.empty()) return;
  device_->laps.back().second.synchronize();  // the events before it on the stream are done too
  for (auto& [phase, event] : device_->laps) {
    into_[phase] += device_->from->elapsedTime(event) / 1e3;  // milliseconds
    device_->from = std::move(event);
  }
  device_->laps.clear();
}

nlohmann::json to_json(const StepPhases& phases) {
  nlohmann::json j = {{"steps", phases.steps}, {"step", ms_per_step(phases, phases.total_seconds())}};
  for (StepPhase p : kPhases) j[step_phase_name(p)] = ms_per_step(phases, phases[p]);
  return j;
}

StepPhases step_phases_from_json(const nlohmann::json& j) {
  StepPhases phases;
  phases.steps = j.at("steps").get<int64_t>();
  for (StepPhase p : kPhases) phases[p] = j.at(step_phase_name(p)).get<double>() * phases.steps / 1e3;
  return phases;
}

std::string step_phases_table(const std::vector<StepPhases>& per_rank) {
  std::string out = fmt::format("{:<16}", "ms per step");
  for (size_t r = 0; r < per_rank.size(); ++r) out += fmt::format(" {:>17}", fmt::format("rank {}", r));
  out += "\n";
  auto row = [&](const std::string& name, auto seconds_of) {
    out += fmt::format("{:<16}", name);
    for (const auto& p : per_rank) {
      const double s = seconds_of(p), total = p.total_seconds();
      out += fmt::format(" {:>9.2f} ({:>4.1f}%)", ms_per_step(p, s), total > 0 ? 100 * s / total : 0.0);
    }
    out += "\n";
  };
  for (StepPhase phase : kPhases) row(step_phase_name(phase), [phase](const StepPhases& p) { return p[phase]; });
  row("step", [](const StepPhases& p) { return p.total_seconds(); });
  return out;
}

}  // namespace ampp::train
