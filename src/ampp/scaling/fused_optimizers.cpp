// See fused_optimizers.h. Each step groups the parameters that have gradients by device and dtype (one
// kernel call per group, as PyTorch's _group_tensors_by_device_and_dtype) and passes the scaler's
// tensors on; nothing here reads a tensor's value on the host.
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/util/optimizer_compat.h>

#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "torch_compat.h"

namespace ampp {
namespace {

using GroupKey = std::tuple<std::string, c10::ScalarType>;  // device, dtype

GroupKey group_key_of(const torch::Tensor& param) { return {param.device().str(), param.scalar_type()}; }

const torch::Tensor& dense_grad_of(const torch::Tensor& param, const char* optimizer) {
  TORCH_CHECK(!param.grad().is_sparse(), "ampp::", optimizer,
              ": sparse gradients are not supported by the fused kernels; use the torch::optim optimizer.");
  return param.grad();
}

// The closure's loss, computed with autograd on, as torch::optim's steps do (undefined without one).
torch::Tensor loss_of(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  torch::AutoGradMode enable_grad(true);
  return closure();
}

struct SgdGroup {
  std::vector<torch::Tensor> params, grads, buffers;
};

struct AdamWGroup {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

}  // namespace

std::optional<torch::Tensor> GradScaleAwareOptimizer::grad_scale_on(const torch::Device& device) const {
  if (!grad_scale_.defined()) return std::nullopt;
  return grad_scale_.to(device);  // no copy when it is there already
}

std::optional<torch::Tensor> GradScaleAwareOptimizer::found_inf_on(const torch::Device& device) const {
  if (!found_inf_.defined()) return std::nullopt;
  return found_inf_.to(device);
}

std::variant<double, torch::Tensor> GradScaleAwareOptimizer::lr_on(const torch::Device& device, double lr) const {
  if (!lr_.defined()) return lr;
  TORCH_CHECK(lr_.dim() == 0 && lr_.is_floating_point() && lr_.device() == device,
              "GradScaleAwareOptimizer::set_lr_tensor: the lr must be a 0-dim floating-point tensor on the "
              "parameters' device (",
              device, "), got ", lr_.scalar_type(), " of shape ", lr_.sizes(), " on ", lr_.device());
  TORCH_CHECK(device.is_cpu() || lr_.scalar_type() == torch::kFloat,
              "GradScaleAwareOptimizer::set_lr_tensor: on a GPU the lr must be float32 (ATen's fused kernels "
              "read a float), got ",
              lr_.scalar_type());
  return lr_;
}

torch::Tensor FusedSGD::step(LossClosure closure) {
  scaling::compat::check_fused_optimizers("FusedSGD", "SGD");
  const torch::Tensor loss = loss_of(closure);
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const bool with_momentum = o.momentum() != 0;
    bool is_first_step = with_momentum;  // every buffer new: the kernel copies the gradients in
    std::map<GroupKey, SgdGroup> groups;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      SgdGroup& g = groups[group_key_of(p)];
      g.params.push_back(p);
      g.grads.push_back(dense_grad_of(p, "FusedSGD"));
      if (!with_momentum) continue;
      auto& slot = state()[optimizer_state_key(p)];
      if (!slot) {
        // Zeros, not empty_like (see the header): finite even if this first step is skipped.
        slot = std::make_unique<torch::optim::SGDParamState>();
        static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer(torch::zeros_like(p));
      } else {
        is_first_step = false;
      }
      g.buffers.push_back(static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer());
    }
    // With zero buffers, dampening 0 makes the first step the same with or without is_first_step.
    if (o.dampening() == 0) is_first_step = false;
    for (auto& entry : groups) {
      auto& g = entry.second;  // not a structured binding: lambdas capture those only from C++20
      const torch::Device device = g.params.front().device();
      std::visit(
          [&](const auto& lr) {
            scaling::compat::fused_sgd_(g.params, g.grads, g.buffers, o.weight_decay(), o.momentum(), lr, o.dampening(),
                                        o.nesterov(), /*maximize=*/false, is_first_step, grad_scale_on(device),
                                        found_inf_on(device));
          },
          lr_on(device, o.lr()));
    }
  }
  end_of_step();
  return loss;
}

torch::Tensor& FusedAdamW::step_count(const torch::Tensor& param, const torch::optim::AdamWParamState& state) {
  auto [it, inserted] = step_counts_.try_emplace(optimizer_state_key(param));
  // float32 on the parameter's device, as PyTorch's fused AdamW keeps `step`; from the state after load().
  if (inserted) it->second = torch::full({}, static_cast<double>(state.step()), param.options().dtype(torch::kFloat));
  return it->second;
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  scaling::compat::check_fused_optimizers("FusedAdamW", "AdamW");
  const torch::Tensor loss = loss_of(closure);
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::map<GroupKey, AdamWGroup> groups;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state()[optimizer_state_key(p)];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->exp_avg(torch::zeros_like(p)).exp_avg_sq(torch::zeros_like(p));
        if (o.amsgrad()) fresh->max_exp_avg_sq(torch::zeros_like(p));
        slot = std::move(fresh);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      AdamWGroup& g = groups[group_key_of(p)];
      g.params.push_back(p);
      g.grads.push_back(dense_grad_of(p, "FusedAdamW"));
      g.exp_avgs.push_back(s.exp_avg());
      g.exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) g.max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      g.steps.push_back(step_count(p, s));
    }
    for (auto& entry : groups) {
      auto& g = entry.second;  // not a structured binding: lambdas capture those only from C++20
      const torch::Device device = g.params.front().device();
      const auto found_inf = found_inf_on(device);
      // PyTorch: count the step first (bias correction uses it), take it back where it was skipped.
      torch::_foreach_add_(g.steps, 1);
      std::visit(
          [&](const auto& lr) {
            scaling::compat::fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, g.max_exp_avg_sqs, g.steps, lr,
                                          std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                                          o.amsgrad(), /*maximize=*/false, grad_scale_on(device), found_inf);
          },
          lr_on(device, o.lr()));
      if (found_inf) torch::_foreach_sub_(g.steps, std::vector<torch::Tensor>(g.steps.size(), *found_inf));
    }
  }
  end_of_step();
  return loss;
}

void FusedAdamW::sync_step_counts() const {
  for (const auto& [key, count] : step_counts_) {
    const auto it = state().find(key);
    if (it != state().end())
      static_cast<torch::optim::AdamWParamState&>(*it->second).step(static_cast<int64_t>(count.item<float>()));
  }
}

void FusedAdamW::save(torch::serialize::OutputArchive& archive) const {
  sync_step_counts();
  torch::optim::AdamW::save(archive);
}

void FusedAdamW::load(torch::serialize::InputArchive& archive) {
  torch::optim::AdamW::load(archive);
  step_counts_.clear();  // rebuilt from the loaded AdamWParamState::step on the next step()
}

}  // namespace ampp
