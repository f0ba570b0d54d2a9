#pragma once
// Internal to ampp: the cosine schedule on a trainer that reads the steps' results only at log points (on a
// GPU, eager or TrainOptions::cuda_graphs). The host knows of a skipped step only at its next read, so its
// count of the steps taken, the cosine's position, would lag. Instead the lr of each step is looked up on
// the device, in a table of the schedule's values computed on the host (scheduled_lr, the eager trainer's
// own formula), at a count of the steps taken that the step itself keeps on the device (a skipped step does
// not count). A captured graph then follows the schedule, skips included, without reading anything on the
// host, and steps with the eager trainer's lr values: exactly in float64 on the CPU, rounded to float32 on
// a GPU, whose fused kernels read a float lr.
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>

namespace ampp::train::detail {

class DeviceLrSchedule {
 public:
  // lr_of(k): the lr of a step taken after k others; k from 0 to last_step, the lr stays lr_of(last_step)
  // after it.
  DeviceLrSchedule(const std::function<double(int64_t)>& lr_of, int64_t last_step, const torch::Device& device);

  // From here on the device counts the steps taken, starting at the host's exact count (after a read).
  void start(int64_t steps_taken);
  bool started() const { return started_; }

  // Before the optimizer's step: this step's lr into `optimizer` (ampp's fused optimizers read the device
  // tensor; another optimizer, on the CPU only, gets its value, a free host read there).
  void apply(torch::optim::Optimizer& optimizer);
  // After it: one more step taken unless `skipped` (0-dim, non-zero where the step was skipped) says not.
  void count(const torch::Tensor& skipped);

  // The last applied lr (a host read: at read points only).
  double last_lr() const { return lr_.item<double>(); }

 private:
  torch::Tensor table_;        // the schedule, one lr per count of steps taken
  torch::Tensor steps_taken_;  // int64, 0-dim, on the device
  torch::Tensor lr_;           // 0-dim: float32 on a GPU, float64 on the CPU
  bool started_ = false;
};

}  // namespace ampp::train::detail
