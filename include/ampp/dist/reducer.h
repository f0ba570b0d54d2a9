#pragma once
// The engine of DistributedDataParallel (PyTorch's c10d::Reducer, re-implemented because Debian's
// reducer.hpp cannot be included): gradient buckets, per-parameter hooks after gradient
// accumulation, asynchronous bucket allreduce overlapping backward, and the end-of-backward wait.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <ampp/dist/comm_hooks.h>
#include <ampp/dist/join.h>
#include <ampp/dist/process_group.h>

namespace ampp::dist {

struct DistributedDataParallelOptions;  // ddp.h

// Assigns tensors (visited in `order`) to buckets per dtype/device: a bucket closes when its bytes
// reach its limit; the k-th bucket of a dtype uses size_limits[k] (the last limit repeats); open
// buckets are closed at the end. Buckets come back in the order they were closed.
std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(const std::vector<torch::Tensor>& tensors,
                                                                   const std::vector<int64_t>& size_limits,
                                                                   const std::vector<size_t>& order);

// Diagnostic timeline of the last synchronised backward (steady_clock).
struct BucketTimeline {
  size_t index = 0;
  size_t num_params = 0;
  int64_t bytes = 0;
  std::chrono::steady_clock::time_point launched;   // allreduce (hook) started
  std::chrono::steady_clock::time_point completed;  // collective future completed
};
struct IterationTimeline {
  std::chrono::steady_clock::time_point first_hook;      // first gradient ready
  std::chrono::steady_clock::time_point last_hook;       // last gradient ready (backward compute done)
  std::chrono::steady_clock::time_point finalize_begin;  // autograd graph finished; waits start
  std::chrono::steady_clock::time_point finalize_end;    // all waits done, grads written
  std::vector<BucketTimeline> buckets;
};

class Reducer : public Joinable {
 public:
  // Takes the module's parameters (deduplicated, requires_grad only, registration order) and
  // buffers, checks that every rank has the same model, broadcasts rank 0's parameters and
  // buffers, builds buckets and installs the gradient hooks.
  Reducer(std::shared_ptr<torch::nn::Module> module, ProcessGroup group, DistributedDataParallelOptions options);
  ~Reducer() override;
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Around the wrapped module's forward (DistributedDataParallel calls these).
  void pre_forward();
  void post_forward(const std::vector<torch::Tensor>& outputs);

  // no_sync(): while false, backward accumulates locally without communication.
  void set_require_backward_grad_sync(bool on);
  bool require_backward_grad_sync() const;

  // Replace the default (pre-divide + allreduce SUM) reduction. Once, before training.
  void register_comm_hook(CommHook hook);
  // Replace the default buffer broadcast of each forward (Gloo). Once, before training.
  void register_buffer_broadcast(BufferBroadcast broadcast);

  const std::vector<std::vector<size_t>>& bucket_indices() const;
  const std::vector<torch::Tensor>& parameters() const;
  const std::vector<std::string>& parameter_names() const;
  IterationTimeline last_timeline() const;
  const ProcessGroup& process_group() const;

  // Joinable (join.h): an active rank's forward starts with one allreduce of who is active and who
  // will reduce gradients; a joined rank answers with zeros and shadows the buffer broadcast, the
  // bucket rebuild and the bucket allreduces (through the comm hook, if any) with zero gradients.
  void set_join_mode(const JoinOptions* options) override;
  int shadow_iteration() override;
  void finish_join(bool active_to_the_end) override;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Broadcast tensors from `src` in place: consecutive tensors of any dtypes packed as bytes into flat
// chunks of at most `chunk_bytes`, one collective each (PyTorch's _broadcast_coalesced packs per dtype:
// one collective more per dtype); a lone large tensor travels in place. Bit-exact for every dtype.
void broadcast_coalesced(const ProcessGroup& group, const std::vector<torch::Tensor>& tensors, int64_t chunk_bytes,
                         int src = 0);

}  // namespace ampp::dist
