#pragma once
// Internal to ampp: StepLr, the one source of each step's learning rate in `ampp train`.
//
// Note [the step's lr]
// ~~~~~~~~~~~~~~~~~~~~~
// Every step's lr is scheduled_lr() (run.cpp) of the epoch and the optimizer steps taken before it: the
// one formula. StepLr holds its values in a table, one per count of steps taken, and each step looks its lr
// up at the steps taken that the skip ledger counts where the skip is decided (Amp::ledger(), Note [the skip
// ledger] in skip_ledger.h). So the eager step, a replayed CUDA graph and a run that reads the device only at
// log points all use the same lr, skips included, and the host never needs to know the count first:
//   - a fused optimizer (FusedSGD, FusedAdamW, ZeRO's) reads the table's value as a tensor, on the device;
//   - another optimizer gets it as a double: a host read, free on the CPU, one per step on a GPU
//     (--no-fused-optimizer; Note [what the host reads], run.h).
// The table is float32 on a GPU for the fused kernels (which read a float lr), float64 elsewhere: on the CPU
// the lr is scheduled_lr()'s double exactly. What is reported (metrics, the summary, the checkpoint's
// optimizer) is the lr the last step used, read from the same tensor.
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>

namespace ampp::train::detail {

class StepLr {
 public:
  // lr_of(epoch, k): the lr of a step in `epoch` taken after k others. From k = last_step on, the lr stays
  // lr_of(epoch, last_step) (the warmup's end under StepLR, the cosine's floor). `float_lr`: the table in
  // float32 (a GPU's fused optimizer), else float64.
  StepLr(std::function<double(int64_t, int64_t)> lr_of, int64_t last_step, const torch::Device& device, bool float_lr);

  // At an epoch's start: the epoch's table (StepLR's decay changes it), written into the same tensor.
  void start_epoch(int64_t epoch);
  // Before the optimizer's step: the lr at `taken` (int64, 0-dim, on the device: the ledger's steps taken)
  // into `optimizer`. Tensor operations only where the optimizer is fused (a CUDA graph captures them).
  void apply(torch::optim::Optimizer& optimizer, const torch::Tensor& taken);

  // The last step's lr (a host read: at read points only); before any step, the first step's.
  double last_lr() const;

 private:
  std::function<double(int64_t, int64_t)> lr_of_;
  int64_t last_step_;
  torch::Device device_;
  torch::ScalarType dtype_;
  torch::Tensor table_;  // the schedule, one lr per count of steps taken
  torch::Tensor lr_;     // 0-dim: the last applied lr
  bool applied_ = false;
};

}  // namespace ampp::train::detail
