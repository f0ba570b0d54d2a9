#include <ampp/train/prefetcher.h>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <utility>

namespace ampp::train {

BatchPrefetcher::BatchPrefetcher(BatchIterator& batches, PrefetchOptions options)
    : batches_(batches), options_(options), num_batches_(batches.num_batches()), position_(batches.position()) {
  if (!options_.background()) return;
  if (options_.device().is_cuda())
    copy_stream_ = c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStreamFromGlobalPool(options_.device());
  loader_ = std::thread([this] { load(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  if (!loader_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  taken_.notify_all();
  loader_.join();
}

// One batch from the iterator onto the device. With a side stream, the copies are queued on it (this
// thread's current stream there) and an event marks their end, for the step's stream to wait on.
BatchPrefetcher::Slot BatchPrefetcher::prepare() {
  Slot slot;
  auto host = batches_.next();
  const torch::Device device = options_.device();
  if (!host || device.is_cpu() || host->data.device() == device) {  // nothing to copy
    slot.batch = std::move(host);
    return slot;
  }
  std::optional<c10::StreamGuard> on_side_stream;
  if (copy_stream_) on_side_stream.emplace(*copy_stream_);
  const bool pinned = options_.pinned();
  auto copy = [&](const torch::Tensor& t) {
    return pinned ? t.pin_memory().to(device, /*non_blocking=*/true) : t.to(device);
  };
  slot.batch = Batch{copy(host->data), copy(host->target)};
  if (copy_stream_) {
    slot.copied = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
    slot.copied->record(*copy_stream_);
  }
  return slot;
}

// prepare(), its error kept for the caller of next().
BatchPrefetcher::Slot BatchPrefetcher::prepare_or_fail() {
  try {
    return prepare();
  } catch (...) {
    Slot failed;
    failed.error = std::current_exception();
    return failed;
  }
}

// The loader thread: one batch ahead. It waits until the last prepared batch was taken, prepares the
// next while the caller's step runs, and stops after the end or an error.
void BatchPrefetcher::load() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      taken_.wait(lock, [this] { return !full_ || stopping_; });
      if (stopping_) return;
    }
    Slot slot = prepare_or_fail();
    const bool last = !slot.batch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot_ = std::move(slot);
      full_ = true;
    }
    filled_.notify_one();
    if (last) return;
  }
}

BatchPrefetcher::Slot BatchPrefetcher::take() {
  if (!loader_.joinable()) return prepare_or_fail();
  Slot slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    filled_.wait(lock, [this] { return full_; });
    slot = std::move(slot_);
    full_ = false;
  }
  taken_.notify_one();
  return slot;
}

// On the side stream's batch: the caller's stream waits for its copy, and the caching allocator learns
// that the caller's stream uses its memory (else the side stream could reuse it for a later batch while
// this step still reads it).
std::optional<Batch> BatchPrefetcher::hand_over(Slot slot) {
  if (slot.error) std::rethrow_exception(slot.error);
  if (!slot.batch) return std::nullopt;
  if (slot.copied) {
    const c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
    const c10::Stream current = cuda.getStream(options_.device());
    slot.copied->block(current);
    for (const auto* t : {&slot.batch->data, &slot.batch->target})
      cuda.recordDataPtrOnStream(t->storage().data_ptr(), current);
  }
  ++position_;
  return std::move(slot.batch);
}

std::optional<Batch> BatchPrefetcher::next() {
  if (ended_) return std::nullopt;
  Slot slot = take();
  ended_ = !slot.batch;
  return hand_over(std::move(slot));
}

}  // namespace ampp::train
