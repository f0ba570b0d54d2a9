#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// An allreduce among the ranks of one machine through a shared-memory segment, instead of Gloo's
// loopback TCP: each rank copies its tensor into its slot, waits for the others (a futex barrier in the
// segment: no spinning thread steals another worker's core), then sums the slots in rank order. For the
// default CNN's 0.82 MB of gradients Gloo's allreduce takes ~1.6 ms on 2 local ranks; this is a copy and
// an add at memory bandwidth. Same result on every rank; bit-identical to Gloo's for 2 ranks (a+b is
// commutative); for 3+ ranks the sum is in rank order (Gloo's ring adds in another order).
#include <ampp/dist/comm_hooks.h>
#include <ampp/dist/process_group.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace ampp::dist {

class SharedMemoryAllreduce {
 public:
  // Collective over `group`: rank 0 creates a segment for tensors of up to `capacity_bytes`, every rank
  // maps it (and it is unlinked at once: nothing is left in /dev/shm, even after a crash). Throws on
  // every rank when any rank cannot map it (ranks on several machines: use Gloo, allreduce_hook).
  SharedMemoryAllreduce(ProcessGroup group, int64_t capacity_bytes);
  ~SharedMemoryAllreduce();
  SharedMemoryAllreduce(const SharedMemoryAllreduce&) = delete;
  SharedMemoryAllreduce& operator=(const SharedMemoryAllreduce&) = delete;

  // The sum over the ranks of `tensor` (contiguous, CPU), in place. 16-bit floats are summed in fp32
  // and rounded once. Every rank must call it, in the same order, with tensors of the same size and
  // dtype; a rank that does not arrive within the group's timeout is an error, not a hang.
  void sum_(torch::Tensor& tensor);
  // Rank `root`'s `tensors` (CPU, any dtypes, together at most capacity_bytes()) into every rank's, in
  // place: root copies them into its slot one after another, the others copy them out after the
  // barrier. The same calling rules as sum_ (every rank, same order, same sizes and dtypes).
  void broadcast_(const std::vector<torch::Tensor>& tensors, int root);
  // Every rank's `mine` (contiguous CPU, the same size on every rank) into row r of `all` ([world, ...mine's
  // shape], contiguous): an all-gather of bits, any dtype, in pieces of at most capacity_bytes(). The same
  // calling rules as sum_.
  void all_gather_(const torch::Tensor& mine, torch::Tensor& all);
  // Row `rank` of the sum over the ranks of `input` ([world, n], contiguous CPU) into `output` ([n]): a
  // reduce-scatter, summed in rank order (16-bit floats in fp32, rounded once), so bit-identical to Gloo's for 2
  // ranks. In pieces of [world, columns] that fill a slot; each rank adds only its own row. The same calling
  // rules as sum_.
  void reduce_scatter_sum_(const torch::Tensor& input, torch::Tensor& output);
  int64_t capacity_bytes() const;
  // The bytes broadcast_ needs for `tensors` (each starts on a cache line).
  static int64_t broadcast_bytes(const std::vector<torch::Tensor>& tensors);

 private:
  struct Segment;
  std::unique_ptr<Segment> segment_;
};

// The smallest segments the DDP hooks make: few regrowths for gradient buckets, room for BatchNorm buffers.
inline constexpr int64_t kMinimumBucketSegment = int64_t{1} << 20;
inline constexpr int64_t kMinimumBufferSegment = int64_t{64} << 10;

// `segment` made, or remade larger, to hold `bytes` (at least `minimum_bytes` when made): a collective over
// `group` whenever it makes one, so call it where every rank asks for the same sizes in the same order.
SharedMemoryAllreduce& sized_segment(std::unique_ptr<SharedMemoryAllreduce>& segment, const ProcessGroup& group,
                                     int64_t bytes, int64_t minimum_bytes);

// DDP's default reduction (divide by the world size, sum) through a SharedMemoryAllreduce sized on
// first use and regrown, on every rank alike, for a larger bucket. Completes before it returns (no
// overlap with backward: with one core per worker a communication thread would only compete with it).
CommHook shared_memory_allreduce_hook(ProcessGroup group);

// DDP's per-forward buffer broadcast (BatchNorm's statistics and counters) through a SharedMemoryAllreduce
// of its own (DistributedDataParallel::register_buffer_broadcast): bit-exact copies, no Gloo round trip
// and no Gloo thread woken on every step.
BufferBroadcast shared_memory_buffer_broadcast(ProcessGroup group);

}  // namespace ampp::dist
