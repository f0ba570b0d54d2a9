#include <ampp/train/allocator.h>

#include <cstddef>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ampp::train {

bool retain_freed_memory() {
#if defined(__GLIBC__)
  // 32 MiB is glibc's ceiling for the mmap threshold on 64-bit; setting it also stops glibc from
  // moving the threshold by itself. Larger tensors (a whole dataset) still get their own mapping.
  constexpr int kMmapThreshold = 32 << 20;
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;  // never in practice: 1 GiB free at the top
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

bool return_freed_memory() {
#if defined(__GLIBC__)
  constexpr int kMmapThreshold = 128 << 10;  // glibc's initial threshold, now fixed
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace ampp::train
