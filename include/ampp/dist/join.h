#pragma once
// Uneven inputs: PyTorch's Join for ampp's DistributedDataParallel. A rank that runs out of batches
// keeps answering the other ranks' collectives (with neutral data) until every rank is done, instead
// of leaving them waiting forever in their next allreduce:
//
//   ampp::dist::join(ddp.joinable(), [&] {
//     for (auto& batch : my_batches) {                 // ranks may have different numbers
//       optimizer.zero_grad();
//       criterion(ddp.forward(batch.data), batch.target).backward();
//       optimizer.step();
//     }
//   });
//
// While a rank shadows, it contributes zero gradients; DDP still divides by the whole world size (as
// PyTorch's default divide_by_initial_world_size), so a step with k active ranks applies the sum of
// their gradients / W. Buffers are broadcast from the highest active rank. When every rank is done,
// the parameters and buffers of a rank that was active to the end are broadcast to all (the joined
// ranks' optimizer state stays as it was when they joined, as in PyTorch).
#include <cstdint>
#include <functional>
#include <vector>

#include <torch/arg.h>

namespace ampp::dist {

struct JoinOptions {
  // false: run the loop as it is (no per-iteration collective).
  TORCH_ARG(bool, enable) = true;
  // Instead of shadowing: the first rank to run out raises, and every other rank raises at its next
  // forward, all with a message saying so.
  TORCH_ARG(bool, throw_on_early_termination) = false;
};

// What join() needs from a distributed module (DistributedDataParallel's reducer implements it).
class Joinable {
 public:
  virtual ~Joinable() = default;
  // join() turns join mode on for its loop and off after (nullptr). In join mode every forward of an
  // active rank starts with one small allreduce that tells the joined ranks what to shadow.
  virtual void set_join_mode(const JoinOptions* options) = 0;
  // A joined rank's side of one iteration of the active ranks; returns how many are active (0: all done,
  // nothing shadowed). Only the first joinable of join() answers that; the others' answers are ignored.
  virtual int shadow_iteration() = 0;
  // Once all are done: every rank takes the state of a rank that was active to the end
  // (`active_to_the_end` says whether this one was).
  virtual void finish_join(bool active_to_the_end) = 0;
};

// Runs `loop` (this rank's iterations) in join mode, then shadows the other ranks' iterations until
// every rank's loop has ended. Call it on every rank of the group.
void join(Joinable& joinable, const std::function<void()>& loop, const JoinOptions& options = {});

// Several joinables, in the order an iteration uses them: the first (DDP) runs the per-iteration round
// that says who is active; the others only shadow their collectives after it, e.g.
//   join({&ddp.joinable(), &zero}, loop)   // a ZeroRedundancyOptimizer stepped once per iteration
void join(const std::vector<Joinable*>& joinables, const std::function<void()>& loop, const JoinOptions& options = {});

}  // namespace ampp::dist
