#include <ampp/util/tensor_memory.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace ampp {
namespace {

// LibTorch's raw_allocate() requires data == context, so the bookkeeping lives in a side table
// keyed by the data pointer rather than in the DataPtr's context.
struct TrackedBlock {
  int64_t bytes;
  void* inner_context;
  c10::DeleterFnPtr inner_deleter;
};
std::mutex g_tracked_mutex;
std::unordered_map<void*, TrackedBlock>& tracked_blocks() {
  static auto* m = new std::unordered_map<void*, TrackedBlock>();
  return *m;
}

}  // namespace

// The allocator LibTorch calls. c10::Allocator's interface changed in 2.x: allocate() lost its const and
// copy_data() became pure virtual. Both forms are declared here, none `override`, so whichever the
// LibTorch in use declares virtual is the one overridden; the other is a plain member.
class TrackingAllocator final : public c10::Allocator {
 public:
  TrackingAllocator(c10::Allocator* base, TensorMemoryTracker* counts) : base_(base), counts_(counts) {}
  c10::DataPtr allocate(size_t bytes) const;
  c10::DataPtr allocate(size_t bytes) { return std::as_const(*this).allocate(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const { return &release; }
  static void release(void* data);

 private:
  c10::Allocator* base_;
  TensorMemoryTracker* counts_;
};

namespace {
TensorMemoryTracker* g_counts = nullptr;
}  // namespace

TensorMemoryTracker& TensorMemoryTracker::install() {
  static TensorMemoryTracker* tracker = [] {
    auto* counts = new TensorMemoryTracker();
    g_counts = counts;
    c10::SetCPUAllocator(new TrackingAllocator(c10::GetDefaultCPUAllocator(), counts), /*priority=*/100);
    return counts;
  }();
  return *tracker;
}

c10::DataPtr TrackingAllocator::allocate(size_t bytes) const {
  c10::DataPtr inner = base_->allocate(bytes);
  void* data = inner.get();
  const c10::Device device = inner.device();
  const c10::DeleterFnPtr inner_deleter = inner.get_deleter();
  void* inner_context = inner.release_context();
  {
    std::lock_guard<std::mutex> lock(g_tracked_mutex);
    tracked_blocks()[data] = TrackedBlock{static_cast<int64_t>(bytes), inner_context, inner_deleter};
  }
  const int64_t now = counts_->current_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t seen = counts_->peak_.load();
  while (now > seen && !counts_->peak_.compare_exchange_weak(seen, now)) {
  }
  return {data, data, &TrackingAllocator::release, device};
}

void TrackingAllocator::release(void* data) {
  TrackedBlock block{};
  {
    std::lock_guard<std::mutex> lock(g_tracked_mutex);
    auto it = tracked_blocks().find(data);
    if (it == tracked_blocks().end()) return;
    block = it->second;
    tracked_blocks().erase(it);
  }
  g_counts->current_.fetch_sub(block.bytes);
  if (block.inner_deleter) block.inner_deleter(block.inner_context);
}

}  // namespace ampp
