// Amp::forward casts the tensors inside nested outputs and inputs as apex's applier does (issue 53, item 1): a
// language model that returns (output, (h, c)) under O2 bf16 gave a bf16 loss, silently, and an (h, c) state
// passed back in stayed float32 beside bf16 weights.

#include <ampp/amp/initialize.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ampp_test.h"

namespace {

using State = std::tuple<torch::Tensor, torch::Tensor>;

// An LSTM language model shaped like the tutorials': logits and the LSTM's (h, c).
struct LanguageModelImpl : torch::nn::Module {
  torch::nn::Embedding embed{nullptr};
  torch::nn::LSTM lstm{nullptr};
  torch::nn::Linear head{nullptr};
  LanguageModelImpl()
      : embed(register_module("embed", torch::nn::Embedding(50, 16))),
        lstm(register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(16, 32).batch_first(true)))),
        head(register_module("head", torch::nn::Linear(32, 50))) {}
  std::tuple<torch::Tensor, State> forward(const torch::Tensor& tokens, std::optional<State> state = std::nullopt) {
    auto [out, hc] = lstm->forward(embed->forward(tokens), state);
    return {head->forward(out), hc};
  }
};
TORCH_MODULE(LanguageModel);

// The loss of one forward of a fresh model (seed 0) under `level` bf16, with the (h, c) of a first forward
// passed back in; and the outputs' dtypes.
struct LmRun {
  double loss;
  std::vector<c10::ScalarType> dtypes;
};

LmRun run_at(const std::string& level) {
  torch::manual_seed(0);
  LanguageModel model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  auto amp = ampp::initialize(model, opt, ampp::Properties(level).dtype(torch::kBFloat16));
  const auto tokens = torch::randint(50, {4, 12}), targets = torch::randint(50, {4, 12});
  const auto first = amp.forward(model, tokens);
  const auto [logits, hc] = amp.forward(model, tokens, std::optional<State>(std::get<1>(first)));
  const auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 50}), targets.reshape({-1}));
  return {loss.item<double>(),
          {logits.scalar_type(), std::get<0>(hc).scalar_type(), std::get<1>(hc).scalar_type(), loss.scalar_type()}};
}

TEST(NestedOutputs, AnLstmsOutputAndStateAreFloat32UnderO2AndItsLossIsO1s) {
  const LmRun o1 = run_at("O1"), o2 = run_at("O2");
  for (const auto dtype : o2.dtypes) EXPECT_EQ(dtype, torch::kFloat) << "O2 bf16: every output tensor in float32";
  // The same model and data: the losses differ by bf16's rounding of the weights and activations only.
  EXPECT_NEAR(o2.loss, o1.loss, 2e-2 * o1.loss);
}

// Outputs amp.forward cannot look into (here a struct) pass through uncast, with a warning that names the type.
struct Custom {
  torch::Tensor value;
};
struct CustomOutputImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  CustomOutputImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  Custom forward(const torch::Tensor& x) { return {fc->forward(x)}; }
};
TORCH_MODULE(CustomOutput);

TEST(NestedOutputs, AnOutputItCannotWalkIsNamedInAWarningOnce) {
  torch::manual_seed(0);
  CustomOutput model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  auto amp = ampp::initialize(model, opt, ampp::Properties("O2").dtype(torch::kBFloat16));
  ::testing::internal::CaptureStderr();
  const Custom out = amp.forward(model, torch::randn({2, 4}));
  amp.forward(model, torch::randn({2, 4}));
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.value.scalar_type(), torch::kBFloat16);
  EXPECT_NE(said.find("the model returned a"), std::string::npos) << said;
  EXPECT_NE(said.find("Custom"), std::string::npos) << said;
  EXPECT_EQ(said.find("the model returned a"), said.rfind("the model returned a")) << "once: " << said;
}

// Maps and vectors of tensors, as apex walks dicts and lists: every tensor in them reaches float32.
using Nested = std::map<std::string, std::vector<std::pair<torch::Tensor, int>>>;
struct NestedOutputImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  NestedOutputImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  Nested forward(const torch::Tensor& x) {
    const auto y = fc->forward(x);
    return {{"a", {{y, 1}, {y * 2, 2}}}, {"b", {{x, 3}}}};
  }
};
TORCH_MODULE(NestedOutput);

TEST(NestedOutputs, MapsVectorsAndPairsAreWalked) {
  torch::manual_seed(0);
  NestedOutput model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  auto amp = ampp::initialize(model, opt, ampp::Properties("O2").dtype(torch::kBFloat16));
  const Nested out = amp.forward(model, torch::randn({2, 4}));
  ASSERT_EQ(out.size(), 2u);
  for (const auto& [key, items] : out)
    for (const auto& [t, n] : items) EXPECT_EQ(t.scalar_type(), torch::kFloat) << key << " " << n;
}

}  // namespace
