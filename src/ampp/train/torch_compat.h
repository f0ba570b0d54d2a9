#pragma once
// The train layer's LibTorch version differences.
#include <ampp/util/torch_version.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace ampp::train::compat {

// Causal softmax(q k^T / sqrt(d)) v over [B, heads, T, d]. LibTorch 1.13 has no
// scaled_dot_product_attention: there it is written out (the same maths; the fused kernel does not
// hold the T x T weights).
inline torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if AMPP_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  // As the fused kernel: one op to autocast (no casts inside it), its maths in float32, its output in
  // the inputs' dtype; so fp16 logits beyond 65504 stay finite here too.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t t = q.size(-2);
  const auto qf = q.to(torch::kFloat), kf = k.to(torch::kFloat), vf = v.to(torch::kFloat);
  auto scores = torch::matmul(qf, kf.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  auto future = torch::ones({t, t}, q.options().dtype(torch::kBool)).triu(1);
  // The float's lowest, not -inf: the same zero weight after softmax, and no inf for ampp's
  // non-finite locator to see inside what is one op in 2.x.
  const float masked = std::numeric_limits<float>::lowest();
  return torch::matmul(torch::softmax(scores.masked_fill(future, masked), -1), vf).to(q.scalar_type());
#endif
}

// Optimizer::load puts the saved hyperparameters in force from LibTorch 2.0 on, as PyTorch's
// load_state_dict does; 1.13 loads only the state. This does the rest there, for ampp train's SGD, so
// a resumed run sees the checkpoint's momentum and weight decay (and says so when they differ).
inline void load_sgd_options([[maybe_unused]] torch::serialize::InputArchive& optimizer_archive,
                             [[maybe_unused]] torch::optim::Optimizer& optimizer) {
#if !AMPP_TORCH_AT_LEAST(2, 0)
  auto* sgd = dynamic_cast<torch::optim::SGD*>(&optimizer);
  if (!sgd) return;
  torch::serialize::InputArchive groups;
  optimizer_archive.read("param_groups", groups);
  std::vector<std::pair<std::vector<std::string>, std::unique_ptr<torch::optim::OptimizerOptions>>> saved;
  torch::optim::detail::serialize<torch::optim::SGDOptions>(groups, saved);
  for (size_t i = 0; i < saved.size() && i < sgd->param_groups().size(); ++i)
    static_cast<torch::optim::SGDOptions&>(sgd->param_groups()[i].options()) =
        static_cast<const torch::optim::SGDOptions&>(*saved[i].second);
#endif
}

}  // namespace ampp::train::compat
