#pragma once
// An optimizer that lists every parameter but steps only a shard of them on this process
// (ampp::dist::ZeroRedundancyOptimizer) says so through this interface, so that ampp::initialize
// (a layer below dist) gives FP32 masters to the local shard only, under O2.
#include <torch/types.h>

#include <functional>

namespace ampp {

class ShardedOptimizer {
 public:
  virtual ~ShardedOptimizer() = default;
  // Whether this process steps `param` (an entry of the optimizer's param_groups()).
  virtual bool steps_locally(const torch::Tensor& param) const = 0;
  // From now on the local step updates `master` (an FP32 copy) in place of the locally stepped
  // `param`; the state of `param` moves to it. `param` stays what is shared with the other processes.
  virtual void use_master(const torch::Tensor& param, const torch::Tensor& master) = 0;
  // Runs after each local step, before the parameters are shared: copies the masters into the model.
  virtual void set_after_local_step(std::function<void()> copy_masters_to_model) = 0;
};

}  // namespace ampp
