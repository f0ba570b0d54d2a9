#include "tracking_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace ampp_bench {
namespace {

// LibTorch's raw_allocate() requires data == context, so the bookkeeping lives in a side table
// keyed by the data pointer rather than in the DataPtr's context.
struct Block {
  int64_t bytes;
  void* inner_context;
  c10::DeleterFnPtr inner_deleter;
};
std::mutex g_mutex;
std::unordered_map<void*, Block>& blocks() {
  static auto* m = new std::unordered_map<void*, Block>();
  return *m;
}
std::atomic<int64_t>* g_current = nullptr;

}  // namespace

TrackingAllocator& TrackingAllocator::install() {
  static TrackingAllocator* a = [] {
    auto* t = new TrackingAllocator(c10::GetDefaultCPUAllocator());
    g_current = &t->current_;
    c10::SetCPUAllocator(t, /*priority=*/100);
    return t;
  }();
  return *a;
}

c10::DataPtr TrackingAllocator::allocate(size_t bytes) const {
  c10::DataPtr inner = base_->allocate(bytes);
  void* data = inner.get();
  const c10::Device device = inner.device();
  const c10::DeleterFnPtr inner_deleter = inner.get_deleter();
  void* inner_context = inner.release_context();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    blocks()[data] = Block{static_cast<int64_t>(bytes), inner_context, inner_deleter};
  }
  const int64_t now = current_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t seen = peak_.load();
  while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
  }
  return {data, data, &TrackingAllocator::release, device};
}

c10::DataPtr TrackingAllocator::allocate(size_t bytes) { return std::as_const(*this).allocate(bytes); }

void TrackingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

c10::DeleterFnPtr TrackingAllocator::raw_deleter() const { return &TrackingAllocator::release; }

void TrackingAllocator::release(void* data) {
  Block block{};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = blocks().find(data);
    if (it == blocks().end()) return;
    block = it->second;
    blocks().erase(it);
  }
  g_current->fetch_sub(block.bytes);
  if (block.inner_deleter) block.inner_deleter(block.inner_context);
}

}  // namespace ampp_bench
