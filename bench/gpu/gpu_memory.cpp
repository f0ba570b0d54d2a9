// gpu_memory.h: the CUDA caching allocator's statistics, where this LibTorch has CUDA.
#include "gpu_memory.h"

#include <ampp/util/torch_version.h>

#if AMPP_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#endif

namespace ampp::bench {

void reset_peak_gpu_memory(const torch::Device& device) {
#if AMPP_TORCH_HAS_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
#else
  (void)device;
#endif
}

double peak_gpu_memory_mib(const torch::Device& device) {
#if AMPP_TORCH_HAS_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    // The aggregate pool (index 0 of StatType): every allocation, small and large.
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1 << 20);
  }
#else
  (void)device;
#endif
  return -1;
}

void release_cached_gpu_memory() {
#if AMPP_TORCH_HAS_CUDA
  if (torch::cuda::is_available()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

}  // namespace ampp::bench
