#pragma once
// The train layer's LibTorch version differences.
#include <ampp/util/torch_version.h>
#include <torch/torch.h>

#include <cmath>

namespace ampp::train::compat {

// Causal softmax(q k^T / sqrt(d)) v over [B, heads, T, d]. LibTorch 1.13 has no
// scaled_dot_product_attention: there it is written out (the same maths; the fused kernel does not
// hold the T x T weights).
inline torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if AMPP_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  auto future = torch::ones({t, t}, q.options().dtype(torch::kBool)).triu(1);
  return torch::matmul(torch::softmax(scores.masked_fill(future, -INFINITY), -1), v);
#endif
}

}  // namespace ampp::train::compat
