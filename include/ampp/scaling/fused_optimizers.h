#pragma once
// Optimizers that unscale and skip by themselves, on the device: what PyTorch's fused optimizers do
// (`torch.optim.SGD/AdamW(fused=True)`, `_step_supports_amp_scaling`). GradScaler::step hands them the
// scale and the found-inf flag as tensors, and nothing in the step reads a value on the host: no
// unscale pass, no `.item()`, no synchronisation with a GPU. Same update rules and ATen kernels as
// PyTorch's (`_fused_sgd_`, `_fused_adamw_`); LibTorch 2.4 or newer (docs/grad_scaler.md).
#include <ampp/util/optimizer_compat.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <optional>
#include <unordered_map>
#include <variant>

namespace ampp {

/// An optimizer whose step applies a loss scale and an overflow skip itself. GradScaler::step calls
/// set_grad_scaling() and then step(); a user loop without a GradScaler calls step() alone.
class GradScaleAwareOptimizer {
 public:
  virtual ~GradScaleAwareOptimizer() = default;
  /// For the next step() only: divide the gradients by `grad_scale` (undefined: they are unscaled
  /// already) and leave every tensor untouched where `found_inf` (float32, 1 element) is non-zero.
  void set_grad_scaling(torch::Tensor grad_scale, torch::Tensor found_inf) {
    grad_scale_ = std::move(grad_scale);
    found_inf_ = std::move(found_inf);
  }
  /// For every step() until set again (undefined: off): each param group's learning rate read on the device
  /// from this 0-dim tensor instead of its options' lr() (PyTorch's tensor lr): a CUDA graph replays the
  /// step with whatever value it holds. float32 on a GPU (ATen's fused CUDA kernels read a float); on the
  /// CPU float64 gives the double lr exactly.
  void set_lr_tensor(torch::Tensor lr) { lr_ = std::move(lr); }
  const torch::Tensor& lr_tensor() const { return lr_; }

 protected:
  /// The tensors set for this step, moved to `device`; cleared afterwards by end_of_step().
  std::optional<torch::Tensor> grad_scale_on(const torch::Device& device) const;
  std::optional<torch::Tensor> found_inf_on(const torch::Device& device) const;
  void end_of_step() { grad_scale_ = found_inf_ = torch::Tensor(); }
  /// The lr a group steps with: the lr tensor when one is set (checked to be on `device`), else `lr`.
  std::variant<double, torch::Tensor> lr_on(const torch::Device& device, double lr) const;

 private:
  torch::Tensor grad_scale_, found_inf_, lr_;
};

/// torch::optim::SGD with PyTorch's fused step (`SGD(fused=True)`). Its state is SGD's, so
/// checkpoints move between the two. One difference from PyTorch, on purpose: momentum buffers start
/// at zero instead of uninitialised memory. PyTorch's fused SGD copies the first gradient into them,
/// and when that first step overflows and is skipped, the next step reads uninitialised buffers
/// (values like 1e9 in the weights, measured with torch 2.13). With zero buffers the next finite step
/// starts the momentum: buf = 0 * momentum + (1 - dampening) * g, which is g exactly, as PyTorch's
/// first step, whenever dampening is 0 (the default).
class FusedSGD : public torch::optim::SGD, public GradScaleAwareOptimizer {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

/// torch::optim::AdamW with PyTorch's fused step (`AdamW(fused=True)`). As in PyTorch, the step
/// counts live on the parameters' device (float32), so a skipped step is taken back there without a
/// host read. AdamWParamState::step() is brought up to date by save() and sync_step_counts().
class FusedAdamW : public torch::optim::AdamW, public GradScaleAwareOptimizer {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Copies the device step counts into state()'s AdamWParamState::step (one host read per parameter).
  void sync_step_counts() const;

 private:
  torch::Tensor& step_count(const torch::Tensor& param, const torch::optim::AdamWParamState& state);
  std::unordered_map<OptimizerStateKey, torch::Tensor> step_counts_;  // keyed as state()
};

}  // namespace ampp
