#pragma once
// An optimizer's gradients grouped by device, checked as PyTorch's GradScaler checks them before the
// unscale (grad_scaler.cpp) or the non-finite check of the fused path (grad_scaler_fused.cpp).
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

namespace ampp::scaling::detail {

// An optimizer's gradients on one device, and the parameters they belong to.
struct DeviceGrads {
  std::vector<torch::Tensor> grads, params;
};

// Groups the grads by device (the CPU kernel takes mixed dtypes in one pass).
inline std::map<std::string, DeviceGrads> grads_by_device(torch::optim::Optimizer& optimizer, bool allow_fp16_grads) {
  std::map<std::string, DeviceGrads> per_device;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      torch::Tensor grad = param.grad();
      TORCH_CHECK(allow_fp16_grads || grad.scalar_type() != torch::kHalf,
                  "Attempting to unscale FP16 gradients. Keep the parameters (master weights) in fp32 and let "
                  "autocast run ops in fp16, or set GradScalerOptions().allow_fp16_grads(true) for pure-fp16 "
                  "training.");
      if (grad.is_sparse()) {
        // Coalescing may sum scaled duplicates into an inf: coalesce first so that is what gets checked.
        if (grad.scalar_type() == torch::kHalf) {
          param.mutable_grad() = grad.coalesce();
          grad = param.grad();
        }
        grad = grad._values();
      }
      auto& d = per_device[grad.device().str()];
      d.grads.push_back(grad);
      d.params.push_back(param);
    }
  }
  return per_device;
}

}  // namespace ampp::scaling::detail
