// StepTally (step_tally.h): the trainer's per-step sums and skip flags, on the device until a read.
#include "step_tally.h"

namespace ampp::train::detail {

namespace {

// The ledger's count of skipped steps where the tally is, float64 (0 before the ledger's first step).
torch::Tensor ledger_skipped(const SkipLedger& ledger, const torch::TensorOptions& on) {
  return ledger.skipped_count().defined() ? ledger.skipped_count().to(on.device(), torch::kDouble)
                                          : torch::zeros({}, on.dtype(torch::kDouble));
}

}  // namespace

StepTally::StepTally(int64_t max_consecutive_skips, int64_t steps_between_reads)
    : rules_(max_consecutive_skips), ring_size_(std::max<int64_t>(1, steps_between_reads)) {}

void StepTally::add_on_device(const Step& step, const torch::Tensor& target) {
  torch::NoGradGuard no_grad;
  const auto on = step.loss.options();
  if (!loss_sum_.defined()) {  // made by the first (eager) step, before any capture
    loss_sum_ = torch::zeros({}, on.dtype(torch::kDouble));
    correct_ = torch::zeros({}, on.dtype(torch::kLong));
    last_loss_ = torch::zeros({}, on.dtype(torch::kFloat));
    skip_ring_ = torch::zeros({ring_size_}, on.dtype(torch::kFloat));
    cursor_ = torch::zeros({1}, on.dtype(torch::kLong));
  }
  // The float loss times the targets, added in double: the product of a float and a count below 2^29 is
  // exact in double, and float values in double add exactly (a few dozen bits of 53), so the grouping of
  // the sums between reads does not change an epoch's sum.
  loss_sum_.add_(step.loss, static_cast<double>(target.numel()));
  correct_.add_(correct_prediction_count(step.logits, target));
  last_loss_.copy_(step.loss);
  skip_ring_.index_copy_(0, cursor_, step.skipped.reshape({1}).to(torch::kFloat));
  cursor_.add_(1).remainder_(ring_size_);
}

StepTally::Readout StepTally::read(const SkipLedger& ledger) {
  Readout r;
  r.steps = steps_;
  if (!loss_sum_.defined()) {
    r.skipped_total = ledger.skipped();
    return r;
  }
  const int64_t fresh = steps_ - steps_read_;
  TORCH_INTERNAL_ASSERT(fresh <= ring_size_, "StepTally: ", fresh, " steps since the last read, more than the ring's ",
                        ring_size_);
  const torch::Tensor host =  // one synchronisation for all of it
      torch::cat({torch::stack({loss_sum_, correct_.to(torch::kDouble), last_loss_.to(torch::kDouble),
                                ledger_skipped(ledger, loss_sum_.options())}),
                  skip_ring_.to(torch::kDouble)})
          .cpu();
  const auto v = host.accessor<double, 1>();
  r.loss_sum = v[0];
  r.correct = v[1];
  r.last_loss = v[2];
  r.skipped_total = static_cast<int64_t>(v[3]);     // exact: a count below 2^53
  for (int64_t k = steps_read_; k < steps_; ++k) {  // in order: the ring's slot of step k is k mod its size
    rules_.add(v[4 + k % ring_size_] != 0);
  }
  r.consecutive_skips = rules_.in_a_row();
  r.first_break = rules_.first_break();
  r.seen = seen_;
  loss_sum_.zero_();
  correct_.zero_();
  seen_ = 0;
  steps_read_ = steps_;
  return r;
}

}  // namespace ampp::train::detail
