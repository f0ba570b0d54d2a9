// The GPT of gpt.h: shapes, causality, the tied head, the presets' sizes and clear errors. Its numerics
// against PyTorch are tests/oracle/gpt_step_oracle_test.cpp.
#include <ampp/precision/autocast.h>
#include <ampp/precision/nonfinite_locator.h>
#include <ampp/train/gpt.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <tuple>

#include "ampp_test.h"

using namespace ampp::train;

namespace {

const auto kSmall = GptOptions().vocab_size(256).context(12).n_layer(2).n_head(2).n_embd(16);

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// GPT-2's count with a tied head: embeddings, and per block two LayerNorms, attention and MLP with biases.
int64_t expected_count(const GptOptions& o) {
  const int64_t c = o.n_embd();
  const int64_t block = 2 * 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * 4 * c + 4 * c) + (4 * c * c + c);
  return o.vocab_size() * c + o.context() * c + o.n_layer() * block + 2 * c;
}

}  // namespace

TEST(Gpt, LogitsCoverTheVocabularyAtEveryPosition) {
  torch::manual_seed(0);
  auto model = make_gpt(kSmall);
  auto logits = model->forward(torch::randint(256, {3, 10}, torch::kLong));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10, 256}));
  logits.sum().backward();
  for (const auto& p : model->named_parameters()) EXPECT_TRUE(p.value().grad().defined()) << p.key();
}

TEST(Gpt, APositionSeesOnlyTheTokensBeforeIt) {
  torch::manual_seed(0);
  auto model = make_gpt(kSmall);
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(256, {2, 12}, torch::kLong);
  auto changed = tokens.clone();
  changed.slice(1, 7).random_(256);  // positions 7..11 differ
  auto a = model->forward(tokens), b = model->forward(changed);
  EXPECT_TRUE(torch::allclose(a.slice(1, 0, 7), b.slice(1, 0, 7), 0, 1e-6));
  EXPECT_FALSE(torch::allclose(a.slice(1, 7), b.slice(1, 7), 0, 1e-6));
}

TEST(Gpt, TheHeadIsTheTokenEmbedding) {
  torch::manual_seed(0);
  auto model = make_gpt(kSmall);
  const auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("wte.weight"));
  EXPECT_EQ(params.size(), 4u + 12 * 2);  // wte, wpe, ln_f (2), and 12 tensors per block: no lm_head
  EXPECT_EQ(parameter_count(*model), expected_count(kSmall));
  // The head's gradient reaches the embedding: a loss on one logit moves that token's embedding row.
  auto logits = model->forward(torch::zeros({1, 1}, torch::kLong));
  logits[0][0][200].backward();
  EXPECT_GT(params["wte.weight"].grad()[200].abs().sum().item<double>(), 0);
}

TEST(Gpt, PresetsHaveTheirDocumentedSizes) {
  EXPECT_EQ(expected_count(gpt_preset("gpt-tiny")), 437760);
  // GPT-2 small: 124,439,808 parameters with the tied head (123.65M without the position embeddings).
  EXPECT_EQ(expected_count(gpt_preset("gpt2-124m")), 124439808);
  torch::manual_seed(0);
  EXPECT_EQ(parameter_count(*make_gpt(gpt_preset("gpt-tiny"))), 437760);
  EXPECT_EQ(parameter_count(*make_gpt(gpt_preset("gpt-mini"))), expected_count(gpt_preset("gpt-mini")));
}

TEST(Gpt, BadSizesAndInputsAreClearErrors) {
  AMPP_EXPECT_THROW_WITH(make_gpt(GptOptions().n_embd(30).n_head(4)),
                         "n_embd (30) must be a positive multiple of n_head (4)");
  AMPP_EXPECT_THROW_WITH(gpt_preset("gpt-huge"),
                         "unknown GPT 'gpt-huge'; choose one of: gpt-tiny, gpt-mini, gpt2-124m");
  AMPP_EXPECT_THROW_WITH(make_model("gpt-tiny", ModelOptions().num_classes(300)),
                         "the data has 300 token values but gpt-tiny's vocabulary is 256");
  auto model = make_gpt(kSmall);
  AMPP_EXPECT_THROW_WITH(model->forward(torch::zeros({1, 13}, torch::kLong)),
                         "a sequence of 13 tokens is longer than the GPT's context (12)");
  AMPP_EXPECT_THROW_WITH(model->forward(torch::zeros({1, 1, 28, 28})), "the GPT takes token ids [batch, time]");
}

TEST(Gpt, ModelOptionsOverrideThePresetsSizes) {
  torch::manual_seed(0);
  auto model = make_model("gpt-tiny", ModelOptions().num_classes(256).context(32).n_layer(1).n_head(2).n_embd(8));
  EXPECT_EQ(parameter_count(*model), expected_count(GptOptions().context(32).n_layer(1).n_head(2).n_embd(8)));
}

// fp16 attention logits (q . k / sqrt(d)) of about 3e5, beyond fp16's 65504: the fused attention keeps them
// in float32, so nothing overflows where a hand-written q @ k^T in fp16 would. When the attention's own
// projection overflows instead, the numerics doctor's locator names it.
TEST(Gpt, Fp16AttentionLogitsStayFiniteAndAProjectionOverflowIsNamed) {
  torch::manual_seed(0);
  auto model = make_gpt(kSmall);  // heads of 8
  auto c_attn = model->named_parameters()["h.0.attn.c_attn.weight"];
  const auto tokens = torch::randint(256, {2, 12}, torch::kLong);
  auto forward_in_fp16 = [&] {
    ampp::NonFiniteLocator locate(*model);
    ampp::autocast region(torch::kCPU, torch::kHalf);
    auto logits = model->forward(tokens);
    return std::make_pair(logits, locate.first());
  };
  torch::NoGradGuard no_grad;
  c_attn.slice(0, 0, 32).mul_(4000);  // q and k rows: entries of about 300, logits of about 3e5
  auto [logits, origin] = forward_in_fp16();
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  EXPECT_FALSE(origin.has_value()) << origin->describe();
  c_attn.slice(0, 0, 32).mul_(1000);  // q and k themselves beyond 65504
  std::tie(logits, origin) = forward_in_fp16();
  ASSERT_TRUE(origin.has_value());
  // Named by the last module whose weights were seen ("after h.0.attn.c_attn"): a 3-d linear is a matmul
  // with the weight's transposed view, not the parameter itself.
  EXPECT_THAT(origin->module, ::testing::HasSubstr("h.0.attn.c_attn")) << origin->describe();
  EXPECT_THAT(origin->output, ::testing::HasSubstr("Half")) << origin->describe();
}
