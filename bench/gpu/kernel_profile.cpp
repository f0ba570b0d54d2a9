// kernel_profile.h: Kineto through LibTorch's C++ profiler API.
#include "kernel_profile.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/profiler_kineto.h>

namespace ampp::bench {
namespace {

using torch::profiler::impl::ActivityType;

struct Tally {
  uint64_t ns = 0;
  int64_t count = 0;
};

// What counts: device events on a GPU (kernels, copies, sets); ATen's operators on a CPU.
bool counted(const torch::autograd::profiler::KinetoEvent& e, bool gpu) {
  if (gpu) return e.deviceType() == c10::DeviceType::CUDA;
  return e.deviceType() == c10::DeviceType::CPU && e.name().rfind("aten::", 0) == 0;
}

}  // namespace

nlohmann::json profile_kernels(const std::function<void()>& steps, const torch::Device& device, int top) {
  namespace prof = torch::autograd::profiler;
  const bool gpu = device.is_cuda();
  std::set<ActivityType> activities{ActivityType::CPU};
  if (gpu) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  steps();
  const auto result = prof::disableProfiler();
  std::map<std::string, Tally> by_name;
  uint64_t total = 0;
  for (const auto& e : result->events()) {
    if (!counted(e, gpu)) continue;
    auto& t = by_name[e.name()];
    t.ns += e.durationNs();
    t.count += 1;
    total += e.durationNs();
  }
  std::vector<std::pair<std::string, Tally>> sorted(by_name.begin(), by_name.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  if (static_cast<int>(sorted.size()) > top) sorted.resize(top);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [name, t] : sorted) rows.push_back({name, static_cast<double>(t.ns) / 1e3, t.count});
  return {{"unit", "us"},
          {"what", gpu ? "GPU kernels, copies and sets" : "ATen operators (CPU, inclusive)"},
          {"total_us", static_cast<double>(total) / 1e3},
          {"top", rows}};
}

}  // namespace ampp::bench
