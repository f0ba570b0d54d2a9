#pragma once
// Counts the bytes of every CPU tensor storage (current and peak) by wrapping LibTorch's CPU
// allocator. Memory that oneDNN/OpenBLAS allocate internally is not seen.

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>

namespace ampp_bench {

class TrackingAllocator final : public c10::Allocator {
 public:
  /// Installs itself as LibTorch's CPU allocator (call before creating tensors to be counted).
  static TrackingAllocator& install();
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
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}
  static void release(void* context);
  c10::Allocator* base_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
};

}  // namespace ampp_bench
