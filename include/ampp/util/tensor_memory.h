#pragma once
// Counts the bytes of every CPU tensor storage, now and at the peak, by wrapping LibTorch's CPU
// allocator (`ampp train --profile`'s memory report, the autocast benchmark). What is not a tensor
// storage is not seen: oneDNN's and BLAS's own scratch, code, allocator slack.

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>

namespace ampp {

class TensorMemoryTracker final : public c10::Allocator {
 public:
  /// Installs the tracker as LibTorch's CPU allocator, once per process (later calls return the same
  /// tracker). Only tensors created afterwards are counted; it stays installed until the process ends.
  static TensorMemoryTracker& install();
  // c10::Allocator's interface changed in 2.x: allocate() lost its const and copy_data() became a
  // pure virtual. Both forms are declared (no `override`), so whichever the LibTorch in use
  // declares virtual is the one overridden; the other is a plain member.
  c10::DataPtr allocate(size_t bytes);
  c10::DataPtr allocate(size_t bytes) const;
  void copy_data(void* dest, const void* src, std::size_t count) const;
  c10::DeleterFnPtr raw_deleter() const override;
  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

 private:
  explicit TensorMemoryTracker(c10::Allocator* base) : base_(base) {}
  static void release(void* data);
  c10::Allocator* base_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
};

}  // namespace ampp
