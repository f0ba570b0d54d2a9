#pragma once
// A loader thread that prepares the next batch while the current step runs, as PyTorch's DataLoader
// with one worker and pin_memory=True: it gathers the batch from the dataset and, on a GPU, copies it
// from pinned host memory on a side stream. The step's stream then waits for that copy (an event on the
// device), never the host. The batches and their order are BatchIterator's, bit for bit.
#include <ampp/train/batches.h>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace ampp::train {

struct PrefetchOptions {
  /* implicit */ PrefetchOptions(torch::Device device) : device_(device) {}
  // Where the batches go.
  TORCH_ARG(torch::Device, device);
  // On a GPU: copied from pinned host memory without blocking the host; false copies from pageable memory.
  TORCH_ARG(bool, pinned) = true;
  // false: no loader thread; each batch is prepared when asked for, on the caller's thread and stream.
  TORCH_ARG(bool, background) = true;
};

class BatchPrefetcher {
 public:
  // Starts preparing `batches`' next batch at once. `batches` must outlive this and is used only by it.
  BatchPrefetcher(BatchIterator& batches, PrefetchOptions options);
  ~BatchPrefetcher();  // stops the loader thread after the batch it is preparing
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The next batch on the device, ready for the caller's current stream; nullopt at the end. An error
  // the loader met is thrown here, once; after it, nullopt.
  std::optional<Batch> next();

  // Batches handed out by next(), counted from the iterator's position when this was made.
  int64_t position() const { return position_; }
  int64_t num_batches() const { return num_batches_; }

 private:
  // A prepared batch, or the end (no batch), or the loader's error; on a GPU, with its copy's event.
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
    std::unique_ptr<c10::Event> copied;
  };
  Slot prepare();
  Slot prepare_or_fail();
  void load();
  Slot take();
  std::optional<Batch> hand_over(Slot slot);

  BatchIterator& batches_;
  const PrefetchOptions options_;
  const int64_t num_batches_;
  int64_t position_;
  bool ended_ = false;
  std::optional<c10::Stream> copy_stream_;  // on a GPU with a loader thread: the copies' side stream

  std::mutex mutex_;
  std::condition_variable filled_, taken_;
  Slot slot_;
  bool full_ = false, stopping_ = false;
  std::thread loader_;  // last: started when everything above is ready
};

}  // namespace ampp::train
