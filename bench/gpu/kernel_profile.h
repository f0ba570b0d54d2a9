#pragma once
// The GPU benchmark's kernel profile: a few steps under LibTorch's profiler (Kineto, as torch.profiler in
// Python), the time summed by name. On a GPU: the device's kernels, memory copies and sets, as CUPTI times
// them. On a CPU: ATen's operators, their time inclusive of the operators they call (what CI can check).
#include <functional>

#include <torch/types.h>
#include <nlohmann/json.hpp>

namespace ampp::bench {

/// Runs `steps` once under the profiler and returns {"unit": "us", "what": ..., "total_us": all events'
/// time, "top": [[name, microseconds, count], ...]} with the `top` names that took the most time.
nlohmann::json profile_kernels(const std::function<void()>& steps, const torch::Device& device, int top);

}  // namespace ampp::bench
