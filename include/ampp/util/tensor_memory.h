#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Counts the bytes of every CPU tensor storage, now and at the peak, by wrapping LibTorch's CPU
// allocator (`ampp train --profile`'s memory report, the autocast benchmark). What is not a tensor
// storage is not seen: oneDNN's and BLAS's own scratch, code, allocator slack.

#include <atomic>
#include <cstdint>

namespace ampp {

class TensorMemoryTracker final {
 public:
  /// Installs the tracker as LibTorch's CPU allocator, once per process (later calls return the same
  /// tracker). Only tensors created afterwards are counted; it stays installed until the process ends.
  static TensorMemoryTracker& install();
  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

 private:
  TensorMemoryTracker() = default;
  friend class TrackingAllocator;  // tensor_memory.cpp: the c10::Allocator that counts into this
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace ampp
