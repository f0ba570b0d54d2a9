#include <ampp/dist/fully_shard.h>
#include <ampp/precision/autocast.h>
#include <ampp/precision/float8_linear.h>
#include <ampp/train/gpt.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "torch_compat.h"

namespace ampp::train {
namespace {
namespace nn = torch::nn;

// ampp::Float8Linear: torch::nn::Linear's parameters and draws, and fp8 products once converted
// (TrainOptions::fp8).
ampp::Float8Linear linear(int64_t in, int64_t out, double std) {
  ampp::Float8Linear l(in, out);
  torch::NoGradGuard no_grad;
  l->weight.normal_(0.0, std);
  l->bias.zero_();
  return l;
}

// On CPU, ATen's fused attention takes 2.7x longer forward and backward on bf16 q, k, v than on the same
// values widened to float32 (gpt-tiny's shapes, 1 thread: 29.5 against 10.9 ms; docs/training.md), while it
// accumulates in float32 either way. So low-precision inputs are widened for it, outside autocast (which
// would lower them again), and the output is rounded back: as precise as the bf16 kernel, and faster.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const auto dtype = q.scalar_type();
  if (!q.is_cpu() || (dtype != torch::kBFloat16 && dtype != torch::kHalf)) return compat::causal_attention(q, k, v);
  ampp::autocast off(torch::kCPU, dtype, /*enabled=*/false);
  return compat::causal_attention(q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat)).to(dtype);
}

// Multi-head causal self-attention: one projection to q, k and v, heads of n_embd / n_head.
struct CausalSelfAttentionImpl : nn::Module {
  CausalSelfAttentionImpl(const GptOptions& o, double proj_std) : n_head(o.n_head()) {
    c_attn = register_module("c_attn", linear(o.n_embd(), 3 * o.n_embd(), 0.02));
    c_proj = register_module("c_proj", linear(o.n_embd(), o.n_embd(), proj_std));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    auto heads = [&](const torch::Tensor& y) { return y.view({b, t, n_head, c / n_head}).transpose(1, 2); };
    auto qkv = c_attn->forward(x).split(c, 2);
    auto y = causal_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]));
    return c_proj->forward(y.transpose(1, 2).contiguous().view({b, t, c}));
  }
  int64_t n_head;
  ampp::Float8Linear c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct MlpBlockImpl : nn::Module {
  MlpBlockImpl(const GptOptions& o, double proj_std) {
    c_fc = register_module("c_fc", linear(o.n_embd(), 4 * o.n_embd(), 0.02));
    c_proj = register_module("c_proj", linear(4 * o.n_embd(), o.n_embd(), proj_std));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c_proj->forward(torch::gelu(c_fc->forward(x))); }
  ampp::Float8Linear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(MlpBlock);

// Pre-LayerNorm: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
struct BlockImpl : nn::Module {
  explicit BlockImpl(const GptOptions& o) {
    const double proj_std = 0.02 / std::sqrt(2.0 * o.n_layer());  // GPT-2: residual paths scaled by depth
    ln_1 = register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({o.n_embd()})));
    attn = register_module("attn", CausalSelfAttention(o, proj_std));
    ln_2 = register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({o.n_embd()})));
    mlp = register_module("mlp", MlpBlock(o, proj_std));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn->forward(ln_1->forward(x));
    return x + mlp->forward(ln_2->forward(x));
  }
  nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MlpBlock mlp{nullptr};
};
TORCH_MODULE(Block);

struct GptImpl : ClassifierImpl {
  explicit GptImpl(const GptOptions& o) : context(o.context()) {
    wte = register_module("wte", nn::Embedding(o.vocab_size(), o.n_embd()));
    wpe = register_module("wpe", nn::Embedding(o.context(), o.n_embd()));
    {
      torch::NoGradGuard no_grad;
      wte->weight.normal_(0.0, 0.02);
      wpe->weight.normal_(0.0, 0.02);
    }
    h = register_module("h", nn::ModuleList());
    for (int64_t i = 0; i < o.n_layer(); ++i) h->push_back(Block(o));
    ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({o.n_embd()})));
  }
  torch::Tensor forward(torch::Tensor tokens) override {
    TORCH_CHECK(tokens.dim() == 2 && !tokens.is_floating_point(), "the GPT takes token ids [batch, time], got ",
                tokens.scalar_type(), " of shape ", tokens.sizes());
    TORCH_CHECK(tokens.size(1) <= context, "a sequence of ", tokens.size(1),
                " tokens is longer than the GPT's context (", context, ")");
    auto x = wte->forward(tokens) + wpe->forward(torch::arange(tokens.size(1), tokens.options()));
    for (const auto& block : *h) {
      auto* b = block->as<Block>();
      x = dist::unit_forward(b, x);  // a unit of its own under FSDP; a plain call otherwise
    }
    // The output head is the token embedding itself (GPT-2's weight tying): one parameter, two uses.
    return torch::nn::functional::linear(ln_f->forward(x), wte->weight);
  }
  // The blocks: the units FSDP gathers one at a time (the embeddings, tied to the head, stay in the root).
  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() const override { return h->children(); }
  int64_t context;
  nn::Embedding wte{nullptr}, wpe{nullptr};
  nn::ModuleList h{nullptr};
  nn::LayerNorm ln_f{nullptr};
};

}  // namespace

const std::vector<std::string>& gpt_names() {
  static const std::vector<std::string> names{"gpt-tiny", "gpt-mini", "gpt2-124m"};
  return names;
}

bool is_gpt(const std::string& model_name) { return model_name.rfind("gpt", 0) == 0; }

GptOptions gpt_preset(const std::string& name) {
  if (name == "gpt-tiny") return GptOptions();
  if (name == "gpt-mini") return GptOptions().context(128).n_layer(4).n_head(4).n_embd(256);
  if (name == "gpt2-124m") return GptOptions().vocab_size(50257).context(1024).n_layer(12).n_head(12).n_embd(768);
  TORCH_CHECK(false, "unknown GPT '", name, "'; choose one of: ", fmt::format("{}", fmt::join(gpt_names(), ", ")));
}

std::shared_ptr<ClassifierImpl> make_gpt(const GptOptions& o) {
  TORCH_CHECK(o.vocab_size() >= 2 && o.context() >= 1 && o.n_layer() >= 1 && o.n_head() >= 1,
              "GptOptions need a vocabulary of at least 2 and at least one position, layer and head; got vocab_size ",
              o.vocab_size(), ", context ", o.context(), ", n_layer ", o.n_layer(), ", n_head ", o.n_head());
  TORCH_CHECK(o.n_embd() >= o.n_head() && o.n_embd() % o.n_head() == 0, "GptOptions::n_embd (", o.n_embd(),
              ") must be a positive multiple of n_head (", o.n_head(), ")");
  return std::make_shared<GptImpl>(o);
}

}  // namespace ampp::train
