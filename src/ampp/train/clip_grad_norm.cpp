#include "clip_grad_norm.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

namespace ampp::train::detail {

std::vector<torch::Tensor> gradients_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

void clip_grad_norm_on_device(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  const auto grads = gradients_of(params);
  if (grads.empty()) return;
  const auto norms = at::_foreach_norm(grads, 2);
  const auto total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
  const auto coef = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  at::_foreach_mul_(grads, coef);
}

}  // namespace ampp::train::detail
