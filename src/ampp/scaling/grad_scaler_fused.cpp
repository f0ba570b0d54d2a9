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
    numerics::non_finite_check_and_unscale_(d.grads, f, device == scale_.device() ? one : one.to(device));
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
  OnDeviceCounts& counts = on_device_counts();
  counts.last_found_inf.copy_(found_inf);
  counts.fused_steps.add_(1);
  counts.skipped_steps.add_(found_inf.gt(0));
  st.fused = true;
  st.stage = OptState::kStepped;
  return true;
}

// update() of an iteration whose every optimizer took the fused path, when the rule needs no host
// value: PyTorch's (ATen's _amp_update_scale_), or a static scale. false: the host rule must run.
bool GradScaler::update_on_device(const torch::Tensor& found_inf_combined, bool all_fused, bool pytorch_rule) {
  if (!all_fused || (options_.dynamic() && !pytorch_rule)) return false;
  OnDeviceCounts& counts = on_device_counts();
  counts.consecutive_overflows.add_(1).mul_(found_inf_combined.gt(0));
  if (!options_.dynamic()) return true;
  numerics::amp_update_scale_(scale_, growth_tracker_, found_inf_combined, options_.growth_factor(),
                              options_.backoff_factor(), options_.growth_interval());
  // The floor the host rule keeps (kMinLossScale), kept here without reading the scale. Reaching it is
  // not reported (at_min_scale needs a host read); consecutive_overflows() tells.
  scale_.clamp_min_(kMinLossScale);
  return true;
}

GradScaler::OnDeviceCounts& GradScaler::on_device_counts() {
  if (!on_device_.skipped_steps.defined()) {
    const auto options = scale_.options().dtype(torch::kLong);
    on_device_.last_found_inf = torch::zeros({}, scale_.options());
    on_device_.consecutive_overflows = torch::full({}, consecutive_overflows_, options);
    on_device_.fused_steps = torch::zeros({}, options);
    on_device_.skipped_steps = torch::zeros({}, options);
  }
  return on_device_;
}

void GradScaler::fold_on_device_counts() const {
  if (!on_device_.skipped_steps.defined()) return;
  const OnDeviceCounts& d = on_device_;
  const torch::Tensor host =  // one host read for the four
      torch::stack({d.fused_steps, d.skipped_steps, d.consecutive_overflows, d.last_found_inf.ne(0).to(torch::kLong)})
          .cpu();
  const auto count = host.accessor<int64_t, 1>();
  if (count[0] == 0) return;  // no fused step since the last fold: the host counts are current
  skipped_steps_ += count[1];
  consecutive_overflows_ = count[2];
  found_inf_last_step_ = count[3] != 0;
  d.fused_steps.zero_();
  d.skipped_steps.zero_();
}

bool GradScaler::found_inf_last_step() const {
  fold_on_device_counts();
  return found_inf_last_step_;
}

int64_t GradScaler::skipped_steps() const {
  fold_on_device_counts();
  return skipped_steps_;
}

int64_t GradScaler::consecutive_overflows() const {
  fold_on_device_counts();
  return consecutive_overflows_;
}

}  // namespace ampp
