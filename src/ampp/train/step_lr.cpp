// StepLr (step_lr.h): each step's lr, looked up at the steps taken.
#include "step_lr.h"

#include <ampp/scaling/fused_optimizers.h>

#include <c10/util/Exception.h>

#include <vector>

#include "set_lr.h"

namespace ampp::train::detail {

namespace {

// A table past this many steps is refused: 128 MiB in float64.
constexpr int64_t kMostTableSteps = int64_t{1} << 24;

}  // namespace

StepLr::StepLr(std::function<double(int64_t, int64_t)> lr_of, int64_t last_step, const torch::Device& device,
               bool float_lr)
    : lr_of_(std::move(lr_of)),
      last_step_(last_step),
      device_(device),
      dtype_(float_lr ? torch::kFloat : torch::kDouble) {
  TORCH_CHECK(last_step >= 0 && last_step < kMostTableSteps, "TrainOptions::lr_decay_steps: a schedule over ",
              last_step, " steps is looked up in a table of its lr values on the device; at most ", kMostTableSteps - 1,
              " steps are supported: set TrainOptions::lr_decay_steps below that, or TrainOptions::lr_schedule step");
  lr_ = torch::zeros({}, torch::dtype(dtype_).device(device));
}

void StepLr::start_epoch(int64_t epoch) {
  std::vector<double> values(static_cast<size_t>(last_step_ + 1));
  for (int64_t k = 0; k <= last_step_; ++k) values[static_cast<size_t>(k)] = lr_of_(epoch, k);
  const torch::Tensor table = torch::tensor(values, torch::kDouble).to(device_, dtype_);
  if (table_.defined())
    table_.copy_(table);  // in place: a captured graph reads this table
  else
    table_ = table;
  if (!applied_) lr_.fill_(values.front());
}

void StepLr::apply(torch::optim::Optimizer& optimizer, const torch::Tensor& taken) {
  TORCH_INTERNAL_ASSERT(table_.defined(), "StepLr::apply before start_epoch");
  torch::NoGradGuard no_grad;
  lr_.copy_(table_.index_select(0, taken.clamp_max(last_step_).reshape({1})).reshape({}));
  applied_ = true;
  if (auto* fused = dynamic_cast<GradScaleAwareOptimizer*>(&optimizer)) {
    if (!fused->lr_tensor().is_same(lr_)) fused->set_lr_tensor(lr_);
    return;
  }
  // A plain optimizer reads a double: free on the CPU, a host read per step on a GPU, which the eager step
  // can afford and a graphed one cannot (validate() demands a fused optimizer there). See Note [what the
  // host reads] (run.h).
  set_lr(optimizer, lr_.item<double>());
}

double StepLr::last_lr() const { return lr_.item<double>(); }

}  // namespace ampp::train::detail
