// StepTally (step_tally.h): the trainer's per-step sums and skip counts, on the device.
#include "step_tally.h"

namespace ampp::train::detail {

void StepTally::add_on_device(const Step& step, const torch::Tensor& target) {
  torch::NoGradGuard no_grad;
  const auto on = step.loss.options();
  if (!loss_sum_.defined()) {  // made by the first (eager) step, before any capture
    loss_sum_ = torch::zeros({}, on.dtype(torch::kDouble));
    correct_ = torch::zeros({}, on.dtype(torch::kLong));
    last_loss_ = torch::zeros({}, on.dtype(torch::kFloat));
    skipped_ = torch::zeros({}, on.dtype(torch::kLong));
    consecutive_ = torch::zeros({}, on.dtype(torch::kLong));
  }
  const torch::Tensor skipped = step.skipped.defined() ? step.skipped : torch::zeros({}, on.dtype(torch::kFloat));
  watch_.after_step(skipped);
  // The float loss in double times the targets: float values in double add exactly (a few dozen bits of
  // 53), so the grouping of the sums between reads does not change an epoch's sum.
  loss_sum_.add_(step.loss.to(torch::kDouble) * static_cast<double>(target.numel()));
  correct_.add_(correct_prediction_count(step.logits, target));
  last_loss_.copy_(step.loss);
  const torch::Tensor was_skipped = skipped.ne(0);
  skipped_.add_(was_skipped);
  consecutive_.add_(1).mul_(was_skipped);
}

StepTally::Readout StepTally::read() {
  Readout r;
  r.steps = steps_;
  if (!loss_sum_.defined()) return r;
  const torch::Tensor host =  // one synchronisation for the five
      torch::stack({loss_sum_, correct_.to(torch::kDouble), last_loss_.to(torch::kDouble), skipped_.to(torch::kDouble),
                    consecutive_.to(torch::kDouble)})
          .cpu();
  const auto v = host.accessor<double, 1>();
  r.loss_sum = v[0];
  r.correct = v[1];
  r.last_loss = v[2];
  r.skipped = static_cast<int64_t>(v[3]);
  r.consecutive_skips = static_cast<int64_t>(v[4]);
  r.seen = seen_;
  r.first_break = watch_.first_break();  // already computed: the read above waited for it
  loss_sum_.zero_();
  correct_.zero_();
  skipped_.zero_();
  seen_ = 0;
  return r;
}

}  // namespace ampp::train::detail
