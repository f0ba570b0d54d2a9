#pragma once
// A GPT-2-style decoder for `ampp train --model gpt-*`: learned position embeddings, pre-LayerNorm blocks,
// causal self-attention through scaled_dot_product_attention, a GELU MLP, and an output head tied to the
// token embedding. Module names follow nanoGPT (wte, wpe, h.N.ln_1, h.N.attn.c_attn, ...), so a state
// dict loads into the Python twin (examples/python/gpt.py) as it is.
#include <ampp/train/models.h>

#include <string>
#include <vector>

namespace ampp::train {

struct GptOptions {
  TORCH_ARG(int64_t, vocab_size) = 256;  // byte-level text: 256
  TORCH_ARG(int64_t, context) = 64;      // the longest sequence (GPT-2: block_size)
  TORCH_ARG(int64_t, n_layer) = 2;
  TORCH_ARG(int64_t, n_head) = 4;
  TORCH_ARG(int64_t, n_embd) = 128;  // a multiple of n_head
};

// The presets by name: gpt-tiny (2 layers x 128, context 64: trains in seconds on 2 cores), gpt-mini
// (4 x 256, context 128) and gpt2-124m (GPT-2 small's shapes: 12 x 768, 12 heads, context 1024, vocabulary
// 50257). vocab_size 256 (the byte-level text) except for gpt2-124m.
const std::vector<std::string>& gpt_names();
bool is_gpt(const std::string& model_name);
GptOptions gpt_preset(const std::string& name);

// forward(tokens [B, T] int64, T <= context) -> logits [B, T, vocab_size]. Parameters drawn from the
// global RNG as nanoGPT draws them (normal(0, 0.02); residual projections 0.02 / sqrt(2 n_layer); zero
// biases), so seed it first.
std::shared_ptr<ClassifierImpl> make_gpt(const GptOptions& options);

}  // namespace ampp::train
