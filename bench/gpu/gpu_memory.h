#pragma once
// The GPU benchmark's memory measure: the peak of memory allocated by LibTorch's CUDA caching allocator,
// what Python's torch.cuda.max_memory_allocated reports, so both sides count the same thing.
#include <torch/types.h>

namespace ampp::bench {

void reset_peak_gpu_memory(const torch::Device& device);
/// MiB at the peak since the reset; -1 on a CPU device, or in a LibTorch without CUDA.
double peak_gpu_memory_mib(const torch::Device& device);
/// Hands the caching allocator's unused blocks back to the driver (nothing without CUDA).
void release_cached_gpu_memory();

}  // namespace ampp::bench
