#pragma once
// Internal to ampp: FSDP's sharded parameters and units (fully_shard.h). A ShardedParam is one module
// parameter split along dim 0; an FsdpUnit gathers, frees and reduce-scatters a set of them together.
#include <ampp/dist/fully_shard.h>
#include <ampp/dist/shared_memory_allreduce.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torch_compat.h"

namespace ampp::dist::detail {

struct ShardedParam {
  std::string name;
  // The module's own parameter, in the gathered dtype; its storage holds no memory while resharded.
  torch::Tensor param;
  // This rank's chunk, FP32, padded to rows_per_rank rows with zeros.
  torch::Tensor padded;
  // padded's first local_rows rows: a leaf that requires grad, what the optimizer steps.
  torch::Tensor shard;
  std::vector<int64_t> sizes;  // of the full parameter (a 0-dim one is sharded as [1])
  int64_t rows = 1;            // sizes[0]
  int64_t rows_per_rank = 1;   // ceil(rows / world)
  int64_t local_rows = 0;
  int64_t row_numel = 1;
  c10::ScalarType gathered = torch::kFloat;
  compat::NodePtr accumulator;  // kept alive: it carries the hook that counts this parameter's gradient

  int64_t chunk_numel() const { return rows_per_rank * row_numel; }
  // Rows of the full parameter that rank r's chunk holds (0 for ranks past the end).
  int64_t rows_of_rank(int r) const { return std::max<int64_t>(0, std::min(rows_per_rank, rows - r * rows_per_rank)); }
};

class FsdpUnit;

// The order the model enters its units through unit_forward, recorded in its first forward: the next unit
// to prefetch in a forward, and (reversed) in a backward.
struct UnitOrder {
  std::vector<FsdpUnit*> recorded;  // the first forward's; empty until its second forward starts
  std::vector<FsdpUnit*> entered;   // this forward's so far
  int64_t prefetched = 0;           // all-gathers issued ahead
  // The recorded unit `step` places from `unit` (+1: the next in a forward, -1: the next in a backward).
  FsdpUnit* neighbour(const FsdpUnit* unit, int step) const;
};

// What a unit needs from its owner.
struct FsdpContext {
  ProcessGroup group;
  FullyShardOptions options;
  // The shared-memory segment the collectives go through (FullyShardOptions::shared_memory), grown on demand;
  // null: the backend's collectives.
  std::shared_ptr<std::unique_ptr<SharedMemoryAllreduce>> shared_memory;
  // Called from a gradient hook during backward: the owner queues its end-of-backward callback once.
  std::function<void()> on_backward;
  std::shared_ptr<UnitOrder> order = std::make_shared<UnitOrder>();
};

class FsdpUnit {
 public:
  FsdpUnit(std::vector<ShardedParam*> params, const FsdpContext* context);

  // All-gathers the parameters into the module's tensors (no-op when gathered), completing a prefetch.
  void unshard();
  // Issues the all-gather without waiting for it (FullyShardOptions::prefetch; the backend's collectives
  // only); unshard() completes it. No-op when gathered or under way.
  void prefetch();
  // Frees the module's parameter memory (no-op when resharded).
  void reshard();
  bool gathered() const { return gathered_; }
  // Averages the gradients across ranks into the shards' .grad (added to what is there), frees the full
  // gradients and reshards. Missing gradients count as zero.
  void reduce_gradients();
  // A parameter's gradient was accumulated; the last one of the unit reduces them.
  void gradient_ready();
  // Whether some but not all parameters got their gradient in this backward.
  bool partly_ready() const { return pending_ != static_cast<int>(trainable_.size()) && pending_ > 0; }
  void reset_pending() { pending_ = static_cast<int>(trainable_.size()); }

  // Entered through unit_forward in a previous forward: the root leaves its gathering to it.
  bool scoped = false;
  const std::vector<ShardedParam*>& params() const { return params_; }
  const FsdpContext& context() const { return *context_; }

 private:
  void reduce_group(const std::vector<ShardedParam*>& group, c10::ScalarType reduce_dtype);
  // This rank's chunk of every parameter, each at its byte offset.
  torch::Tensor packed_chunk() const;
  // Every rank's chunks ([world, chunk_bytes_]) into the module's parameters.
  void unpack_gathered(const torch::Tensor& all);
  // A prefetched all-gather under way: its buffers must live until it completes.
  struct PendingGather {
    torch::Tensor mine, all;
    c10::intrusive_ptr<compat::Work> work;
  };
  std::optional<PendingGather> pending_gather_;

  std::vector<ShardedParam*> params_;
  std::vector<ShardedParam*> trainable_;  // those that require grad: the ones reduced (frozen ones get none)
  const FsdpContext* context_;
  std::vector<int64_t> byte_offsets_;  // of each parameter in a rank's all-gather chunk (16-aligned)
  int64_t chunk_bytes_ = 0;
  bool gathered_ = true;
  int pending_ = 0;
};

// The storage of `param` gets (or loses) its memory in place: views of it saved for backward see the
// gathered values again, and no version counter moves.
void allocate_storage(const torch::Tensor& param);
void free_storage(const torch::Tensor& param);
// A tensor over `param`'s storage with its own version counter (writes into it do not look like
// in-place changes of the parameter to autograd).
torch::Tensor storage_alias(const torch::Tensor& param, at::IntArrayRef sizes);

}  // namespace ampp::dist::detail
