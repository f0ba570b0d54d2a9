#include <ampp/train/op_profile.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "report_json.h"

namespace ampp::train {
namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// An event's start and duration in ns: LibTorch 2.x reports ns, 1.13 us (the overload that compiles is used).
template <typename Event>
auto span_ns(const Event& e, int) -> decltype(e.startNs(), std::pair<int64_t, int64_t>()) {
  return {static_cast<int64_t>(e.startNs()), static_cast<int64_t>(e.durationNs())};
}
template <typename Event>
std::pair<int64_t, int64_t> span_ns(const Event& e, long) {
  return {static_cast<int64_t>(e.startUs()) * 1000, static_cast<int64_t>(e.durationUs()) * 1000};
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Interval {
  const std::string* name;
  int64_t begin, end;
};

// Self and total time per name from one thread's intervals: an interval's self time is its duration
// less that of the intervals directly inside it; a call inside a call of the same name (recursion)
// adds to the self time but not again to the total.
void add_thread(std::vector<Interval>& spans, std::unordered_map<std::string, OpTime>& by_name) {
  std::sort(spans.begin(), spans.end(), [](const Interval& a, const Interval& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
  });
  std::vector<const Interval*> open;
  for (const Interval& s : spans) {
    while (!open.empty() && open.back()->end <= s.begin) open.pop_back();
    const double ms = static_cast<double>(s.end - s.begin) / 1e6;
    OpTime& op = by_name[*s.name];
    op.calls += 1;
    op.self_ms += ms;
    if (!open.empty()) by_name[*open.back()->name].self_ms -= ms;
    const bool recursive =
        std::any_of(open.begin(), open.end(), [&](const Interval* o) { return *o->name == *s.name; });
    if (!recursive) op.total_ms += ms;
    open.push_back(&s);
  }
}

}  // namespace

OpRecorder::OpRecorder() = default;

OpRecorder::~OpRecorder() {
  if (recording_) profiler::disableProfiler();
}

void OpRecorder::start() {
  TORCH_CHECK(!recording_, "OpRecorder::start: already recording");
  const ProfilerConfig config(ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU};
  profiler::prepareProfiler(config, activities);  // Kineto's trace must be prepared before it starts
  profiler::enableProfiler(config, activities);
  recording_ = true;
  started_ns_ = now_ns();
}

OpProfile OpRecorder::stop(int64_t steps) {
  TORCH_CHECK(recording_, "OpRecorder::stop: not recording");
  OpProfile profile;
  profile.recorded_ms = static_cast<double>(now_ns() - started_ns_) / 1e6;
  profile.steps = steps;
  const auto result = profiler::disableProfiler();
  recording_ = false;
  std::vector<std::string> names;  // stable storage for the intervals' names
  names.reserve(result->events().size());
  std::map<uint64_t, std::vector<Interval>> by_thread;
  for (const auto& e : result->events()) {
    names.push_back(e.name());
    const auto [begin, duration] = span_ns(e, 0);
    by_thread[e.startThreadId()].push_back({&names.back(), begin, begin + duration});
  }
  std::unordered_map<std::string, OpTime> by_name;
  for (auto& [thread, spans] : by_thread) add_thread(spans, by_name);
  for (auto& [name, op] : by_name) {
    op.name = name;
    op.self_ms = std::max(0.0, op.self_ms);  // clock granularity can leave a child a hair longer than its parent
    profile.ops.push_back(op);
  }
  std::sort(profile.ops.begin(), profile.ops.end(),
            [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; });
  return profile;
}

nlohmann::json to_json(const OpProfile& p) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& op : p.ops)
    ops.push_back({{"name", op.name}, {"calls", op.calls}, {"self_ms", op.self_ms}, {"total_ms", op.total_ms}});
  return {{"steps", p.steps}, {"recorded_ms", p.recorded_ms}, {"ops", ops}};
}

OpProfile op_profile_from_json(const nlohmann::json& j) {
  OpProfile p;
  p.steps = j.at("steps").get<int64_t>();
  p.recorded_ms = j.at("recorded_ms").get<double>();
  for (const auto& op : j.at("ops"))
    p.ops.push_back({op.at("name").get<std::string>(), op.at("calls").get<int64_t>(), op.at("self_ms").get<double>(),
                     op.at("total_ms").get<double>()});
  return p;
}

std::string op_table(const OpProfile& p, size_t top) {
  const double steps = static_cast<double>(std::max<int64_t>(p.steps, 1));
  std::string out = fmt::format("{:<44} {:>10} {:>12} {:>13} {:>9}\n", "operator", "calls/step", "self ms/step",
                                "total ms/step", "self %");
  for (size_t i = 0; i < std::min(top, p.ops.size()); ++i) {
    const OpTime& op = p.ops[i];
    const double share = p.recorded_ms > 0 ? 100.0 * op.self_ms / p.recorded_ms : 0.0;
    out += fmt::format("{:<44} {:>10.1f} {:>12.3f} {:>13.3f} {:>8.1f}%\n", op.name.substr(0, 44),
                       static_cast<double>(op.calls) / steps, op.self_ms / steps, op.total_ms / steps, share);
  }
  double self_sum = 0;
  for (const auto& op : p.ops) self_sum += op.self_ms;
  out += fmt::format(
      "{} operators; their self time {:.3f} ms/step of {:.3f} ms/step recorded (the rest: between "
      "operators)\n",
      p.ops.size(), self_sum / steps, p.recorded_ms / steps);
  return out;
}

}  // namespace ampp::train
