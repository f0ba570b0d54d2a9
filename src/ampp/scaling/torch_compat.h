#pragma once
// The scaling layer's LibTorch version differences.
#include <ampp/util/torch_version.h>
#include <torch/types.h>

#include <utility>

namespace ampp::scaling::compat {

// A scaled output has the shape PyTorch's GradScaler.scale gives in the version ampp is built against:
// 1.13's scale has shape (1,), so a 0-dim loss scales to shape (1,); 2.x keeps it 0-dim.
inline torch::Tensor scaled_output_shape(torch::Tensor scaled) {
#if !AMPP_TORCH_AT_LEAST(2, 0)
  if (scaled.dim() == 0) return scaled.reshape({1});
#endif
  return scaled;
}

// The fused optimizer kernels that take grad_scale and found_inf, on CPU and CUDA alike: LibTorch
// 2.4 and newer (its CPU kernels came last). Older builds compile FusedSGD and FusedAdamW, whose
// step() then says what is needed.
constexpr bool kHasFusedOptimizers = AMPP_TORCH_AT_LEAST(2, 4);

inline void check_fused_optimizers(const char* name, const char* plain_name) {
  TORCH_CHECK(kHasFusedOptimizers, "ampp::", name,
              " needs LibTorch 2.4 or newer (ATen's fused optimizer kernels); this "
              "build has ",
              TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ". Use torch::optim::", plain_name,
              " with GradScaler instead.");
}

// ATen's fused steps, with ATen's arguments (maximize included), where they exist.
template <typename... Args>
void fused_sgd_([[maybe_unused]] Args&&... args) {
#if AMPP_TORCH_AT_LEAST(2, 4)
  at::_fused_sgd_(std::forward<Args>(args)...);
#else
  check_fused_optimizers("FusedSGD", "SGD");
#endif
}

template <typename... Args>
void fused_adamw_([[maybe_unused]] Args&&... args) {
#if AMPP_TORCH_AT_LEAST(2, 4)
  at::_fused_adamw_(std::forward<Args>(args)...);
#else
  check_fused_optimizers("FusedAdamW", "AdamW");
#endif
}

}  // namespace ampp::scaling::compat
