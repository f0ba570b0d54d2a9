#pragma once
// The scaling layer's LibTorch version differences.
#include <ampp/util/torch_version.h>
#include <torch/types.h>

namespace ampp::scaling::compat {

// A scaled output has the shape PyTorch's GradScaler.scale gives in the version ampp is built against:
// 1.13's scale has shape (1,), so a 0-dim loss scales to shape (1,); 2.x keeps it 0-dim.
inline torch::Tensor scaled_output_shape(torch::Tensor scaled) {
#if !AMPP_TORCH_AT_LEAST(2, 0)
  if (scaled.dim() == 0) return scaled.reshape({1});
#endif
  return scaled;
}

}  // namespace ampp::scaling::compat
