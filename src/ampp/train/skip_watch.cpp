// SkipWatch (skip_watch.h): the eager trainer's two rules on skipped steps, kept on the device.
#include "skip_watch.h"

namespace ampp::train::detail {

void SkipWatch::after_step(const torch::Tensor& found_inf) {
  if (limit_ == 0) return;
  TORCH_CHECK(found_inf.defined(),
              "SkipWatch: no inf/NaN flag on the device; the graphed step needs a fused "
              "optimizer (ampp::FusedSGD), whose step leaves GradScaler's flag there");
  torch::NoGradGuard no_grad;
  const auto on = found_inf.options().dtype(torch::kLong);
  if (!ring_.defined()) {  // made by the first (eager) step, before any capture
    ring_ = torch::zeros({2 * limit_}, on);
    state_ = torch::zeros({3}, on);
    first_break_ = torch::full({3}, -1, on);
  }
  const auto skipped = found_inf.ne(0).to(torch::kLong).reshape({1});
  auto steps = state_.narrow(0, 0, 1), in_a_row = state_.narrow(0, 1, 1), recent = state_.narrow(0, 2, 1);
  // The ring holds the last 2L steps: this step's slot held the step 2L before it, which leaves the window.
  const auto slot = steps.remainder(2 * limit_);
  recent.add_(skipped - ring_.index_select(0, slot));
  ring_.index_copy_(0, slot, skipped);
  in_a_row.add_(1).mul_(skipped);
  steps.add_(1);
  const auto broke = in_a_row.ge(limit_).logical_or(recent.gt(limit_)).logical_and(first_break_.narrow(0, 0, 1).lt(0));
  first_break_.copy_(torch::where(broke, state_, first_break_));
}

std::optional<SkipWatch::Break> SkipWatch::first_break() const {
  if (!first_break_.defined()) return std::nullopt;
  const auto host = first_break_.cpu();
  const auto b = host.accessor<int64_t, 1>();
  if (b[0] < 0) return std::nullopt;
  return Break{b[0], b[1], b[2]};
}

}  // namespace ampp::train::detail
