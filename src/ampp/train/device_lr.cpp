// DeviceLrSchedule (device_lr.h): the cosine schedule looked up on the device.
#include "device_lr.h"

#include <ampp/scaling/fused_optimizers.h>

#include <c10/util/Exception.h>

#include <vector>

#include "set_lr.h"

namespace ampp::train::detail {

namespace {

// A table past this many steps is refused: 128 MiB in float64.
constexpr int64_t kMostTableSteps = int64_t{1} << 24;

}  // namespace

DeviceLrSchedule::DeviceLrSchedule(const std::function<double(int64_t)>& lr_of, int64_t last_step,
                                   const torch::Device& device) {
  TORCH_CHECK(last_step >= 0 && last_step < kMostTableSteps,
              "TrainOptions::lr_decay_steps: on a GPU, a cosine schedule over ", last_step,
              " steps needs a table of its lr values on the device; at most ", kMostTableSteps - 1,
              " steps are supported: set TrainOptions::lr_decay_steps below that, or TrainOptions::lr_schedule step");
  std::vector<double> values(static_cast<size_t>(last_step + 1));
  for (int64_t k = 0; k <= last_step; ++k) values[static_cast<size_t>(k)] = lr_of(k);
  const auto dtype = device.is_cuda() ? torch::kFloat : torch::kDouble;
  table_ = torch::tensor(values, torch::kDouble).to(device, dtype);
  steps_taken_ = torch::zeros({}, torch::dtype(torch::kLong).device(device));
  lr_ = torch::zeros({}, torch::dtype(dtype).device(device));
}

void DeviceLrSchedule::start(int64_t steps_taken) {
  steps_taken_.fill_(steps_taken);
  started_ = true;
}

void DeviceLrSchedule::apply(torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  const auto last = table_.size(0) - 1;
  lr_.copy_(table_.index_select(0, steps_taken_.clamp_max(last).reshape({1})).reshape({}));
  if (auto* fused = dynamic_cast<GradScaleAwareOptimizer*>(&optimizer)) {
    if (!fused->lr_tensor().is_same(lr_)) fused->set_lr_tensor(lr_);
    return;
  }
  // A plain optimizer (--no-fused-optimizer) reads a double: on a GPU that is a host read per step,
  // which the eager step can afford and a graphed one cannot (validate() demands a fused optimizer there).
  // Asserting the CPU here stopped a GPU cosine run with --zero at its first step (issue 52, defect 1).
  // See Note [what the host reads] (run.h).
  set_lr(optimizer, lr_.item<double>());
}

void DeviceLrSchedule::count(const torch::Tensor& skipped) {
  torch::NoGradGuard no_grad;
  steps_taken_.add_((skipped == 0).to(torch::kLong));
}

}  // namespace ampp::train::detail
