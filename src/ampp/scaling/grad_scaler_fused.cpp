// GradScaler's fused path (PyTorch's `_step_supports_amp_scaling` branch of GradScaler.step): the
// optimizer unscales and skips by itself on the device, and the scale update runs there too, so an
// iteration reads nothing on the host. Its counters stay on the device until someone asks for them.
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/scaling/grad_scaler.h>

#include <ampp/numerics/unscale.h>
#include <ampp/numerics/update_scale.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "device_grads.h"

namespace ampp {

// PyTorch's _check_inf_per_device: the non-finite check of the unscale pass, with an inverse scale of 1
// (nothing is unscaled) and fp16 gradients allowed, since the optimizer divides by the scale itself.
void GradScaler::check_inf_per_device(torch::optim::Optimizer& optimizer) {
  PerOptimizerState& st = state_of(optimizer);
  const torch::Tensor one = torch::ones({}, scale_.options());
  st.found_inf_per_device.clear();
  for (auto& [dev, d] : scaling::detail::grads_by_device(optimizer, /*allow_fp16_grads=*/true)) {
    const torch::Device device(dev);
    torch::Tensor f = torch::zeros({}, scale_.options().device(device));
    numerics::non_finite_check_and_unscale_(d.grads, f, device == scale_.device() ? one : one.to(device),
                                            /*inv_scale_at_most_one=*/true);
    st.found_inf_per_device.emplace(dev, f);
  }
  reduce_found_inf_with_hook(st);
}

bool GradScaler::step_fused(torch::optim::Optimizer& optimizer, GradScaleAwareOptimizer& fused) {
  PerOptimizerState& st = state_of(optimizer);
  const bool unscaled = st.stage == OptState::kUnscaled;  // unscale_ ran: the gradients are divided already
  if (st.stage == OptState::kReady) check_inf_per_device(optimizer);
  TORCH_CHECK(!st.found_inf_per_device.empty(),
              "No inf checks were recorded for this optimizer. None of its parameters has a gradient: call "
              "scaler.scale(loss).backward() before step(optimizer), and check that the optimizer holds the "
              "model's parameters.");
  const torch::Tensor found_inf = found_inf_sum(st);
  fused.set_grad_scaling(unscaled ? torch::Tensor() : scale_, found_inf);
  optimizer.step();
  ledger_.record(found_inf);  // on the device: no read
  st.fused = true;
  st.stage = OptState::kStepped;
  return true;
}

// update() with no host read: when every optimizer of the iteration took the fused path (which reads
// nothing either), or when nothing at the floor needs the host (a static scale, or at_min_scale kIgnore:
// ampp::initialize's apex scalers). false: the host rule runs (update_on_host).
bool GradScaler::update_on_device(const torch::Tensor& found_inf_combined, bool all_fused) {
  const bool host_acts_at_floor = options_.dynamic() && options_.at_min_scale() != MinScaleAction::kIgnore;
  if (!all_fused && host_acts_at_floor) return false;
  torch::NoGradGuard no_grad;
  OnDeviceCounts& counts = on_device_counts();
  counts.device_updates.add_(1);
  const torch::Tensor overflow = found_inf_combined.gt(0);
  counts.consecutive_overflows.add_(1).mul_(overflow);
  if (!options_.dynamic()) return true;
  scale_at_least_ = std::max(floor_scale(), scale_at_least_ * options_.backoff_factor());  // at most one backoff
  if (options_.hysteresis() > 1) {
    apply_policy_rule_on_device(overflow);
    return true;
  }
  // An overflow that finds the scale at the floor counts (the host rule's min_scale_overflows_); any
  // finite update restarts the count.
  counts.floor_overflows.add_(scale_.le(floor_scale())).mul_(overflow);  // the product keeps overflows only
  numerics::amp_update_scale_(scale_, growth_tracker_, found_inf_combined, options_.growth_factor(),
                              options_.backoff_factor(), options_.growth_interval());
  // The cap and the floor of the host rule, as clamps of the product (both rules store float(scale *
  // factor) first). Reaching the floor is not reported here (at_min_scale needs a host read);
  // consecutive_overflows() tells.
  scale_.clamp_(floor_scale(), options_.max_scale());
  return true;
}

// apply_policy_rule() with hysteresis, as tensor operations: the same decisions, made with where().
void GradScaler::apply_policy_rule_on_device(const torch::Tensor& overflow) {
  OnDeviceCounts& counts = on_device_counts();
  torch::Tensor& hysteresis = counts.hysteresis_tracker;
  const torch::Tensor consumed = overflow.logical_and(hysteresis.gt(1));  // an overflow the budget absorbs
  const torch::Tensor backs_off = overflow.logical_and(consumed.logical_not());
  const torch::Tensor at_floor = backs_off.logical_and(scale_.le(floor_scale()));
  const torch::Tensor grows = overflow.logical_not().logical_and(growth_tracker_.add(1).eq(options_.growth_interval()));
  // Products in double, stored as float (ATen's and the host rule's arithmetic).
  const torch::Tensor scale = scale_.to(torch::kDouble);
  const torch::Tensor lower = (scale * options_.backoff_factor()).to(torch::kFloat).clamp_min(floor_scale());
  const torch::Tensor higher = (scale * options_.growth_factor()).to(torch::kFloat).clamp_max(options_.max_scale());
  scale_.copy_(torch::where(backs_off.logical_and(at_floor.logical_not()), lower, torch::where(grows, higher, scale_)));
  growth_tracker_.copy_(
      torch::where(overflow.logical_or(grows), torch::zeros_like(growth_tracker_), growth_tracker_ + 1));
  // Refilled on growth, and with consecutive hysteresis on any finite update (growth is one).
  const torch::Tensor refill = options_.consecutive_hysteresis() ? overflow.logical_not() : grows;
  hysteresis.copy_(torch::where(consumed, hysteresis - 1,
                                torch::where(refill, torch::full_like(hysteresis, options_.hysteresis()), hysteresis)));
  counts.floor_overflows.add_(at_floor).mul_(overflow);
}

GradScaler::OnDeviceCounts& GradScaler::on_device_counts() {
  if (!on_device_.device_updates.defined()) {
    const auto options = scale_.options().dtype(torch::kLong);
    on_device_.consecutive_overflows = torch::full({}, consecutive_overflows_, options);
    on_device_.hysteresis_tracker = torch::full({}, hysteresis_tracker_, options);
    on_device_.floor_overflows = torch::full({}, min_scale_overflows_, options);
    on_device_.device_updates = torch::zeros({}, options);
  }
  return on_device_;
}

void GradScaler::fold_on_device_counts() const {
  if (!on_device_.device_updates.defined()) return;
  const OnDeviceCounts& d = on_device_;
  const torch::Tensor host =  // one host read for all of them
      torch::stack({d.device_updates, d.consecutive_overflows, d.hysteresis_tracker, d.floor_overflows}).cpu();
  const auto count = host.accessor<int64_t, 1>();
  if (count[0] == 0) return;  // no update on the device since the last fold: the host counts are current
  consecutive_overflows_ = count[1];
  hysteresis_tracker_ = count[2];
  min_scale_overflows_ = count[3];
  d.device_updates.zero_();
}

int64_t GradScaler::consecutive_overflows() const {
  fold_on_device_counts();
  return consecutive_overflows_;
}

}  // namespace ampp
