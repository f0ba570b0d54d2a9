#include <ampp/util/tensor_memory.h>

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
std::atomic<int64_t>* g_tracked_current = nullptr;

}  // namespace

TensorMemoryTracker& TensorMemoryTracker::install() {
  static TensorMemoryTracker* a = [] {
    auto* t = new TensorMemoryTracker(c10::GetDefaultCPUAllocator());
    g_tracked_current = &t->current_;
    c10::SetCPUAllocator(t, /*priority=*/100);
    return t;
  }();
  return *a;
}

c10::DataPtr TensorMemoryTracker::allocate(size_t bytes) const {
  c10::DataPtr inner = base_->allocate(bytes);
  void* data = inner.get();
  const c10::Device device = inner.device();
  const c10::DeleterFnPtr inner_deleter = inner.get_deleter();
  void* inner_context = inner.release_context();
  {
    std::lock_guard<std::mutex> lock(g_tracked_mutex);
    tracked_blocks()[data] = TrackedBlock{static_cast<int64_t>(bytes), inner_context, inner_deleter};
  }
  const int64_t now = current_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t seen = peak_.load();
  while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
  }
  return {data, data, &TensorMemoryTracker::release, device};
}

c10::DataPtr TensorMemoryTracker::allocate(size_t bytes) { return std::as_const(*this).allocate(bytes); }

void TensorMemoryTracker::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

c10::DeleterFnPtr TensorMemoryTracker::raw_deleter() const { return &TensorMemoryTracker::release; }

void TensorMemoryTracker::release(void* data) {
  TrackedBlock block{};
  {
    std::lock_guard<std::mutex> lock(g_tracked_mutex);
    auto it = tracked_blocks().find(data);
    if (it == tracked_blocks().end()) return;
    block = it->second;
    tracked_blocks().erase(it);
  }
  g_tracked_current->fetch_sub(block.bytes);
  if (block.inner_deleter) block.inner_deleter(block.inner_context);
}

}  // namespace ampp
