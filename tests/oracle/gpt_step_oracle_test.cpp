// One training step of ampp's GPT against Python PyTorch at every opt level (gpt_step_oracle.py): the same
// weights and batch, the loss and every parameter's gradient compared. ampp runs the step as `ampp train`
// does: ampp::initialize, amp.forward, the logits widened to float32, cross-entropy over the vocabulary,
// amp.scale_loss(loss).backward() (gradients unscaled into the masters).
//
// Compared bit for bit in float32 and bf16 (O0, and O1-O3 in bf16): the same ATen kernels, the same casts at
// the same points, one thread on both sides. In fp16 the relative error of each gradient
// (||ampp - torch|| / ||torch||) must stay under 2^-8: ampp emulates fp16 on CPU (float32 carriers rounded
// to fp16 values, docs/precision.md) while PyTorch computes in fp16, so they agree to a few fp16 ulps
// (2^-11 each). Measured: at most 1.2e-3 (O1) and 1.7e-3 (O2, O3).

#include "oracle/oracle.h"
#include "precision/test_util.h"

#include <ampp/amp/initialize.h>
#include <ampp/train/models.h>

#include <gtest/gtest.h>

namespace {

using ampp_oracle::decode;
using ampp_oracle::encode;
using ampp_oracle::json;

const auto kOptions = ampp::train::ModelOptions().num_classes(256).context(16).n_layer(2).n_head(2).n_embd(32);

struct Case {
  ampp::OptLevel level;
  c10::ScalarType dtype;
  double tolerance;  // of the loss and each gradient, relative; 0: bit for bit (see the top of this file)
};

const std::vector<Case> kCases{
    {ampp::OptLevel::O0, torch::kFloat, 0.0},   {ampp::OptLevel::O1, torch::kBFloat16, 0.0},
    {ampp::OptLevel::O1, torch::kHalf, 0x1p-8}, {ampp::OptLevel::O2, torch::kBFloat16, 0.0},
    {ampp::OptLevel::O2, torch::kHalf, 0x1p-8}, {ampp::OptLevel::O3, torch::kBFloat16, 0.0},
    {ampp::OptLevel::O3, torch::kHalf, 0x1p-8},
};

std::shared_ptr<ampp::train::ClassifierImpl> seeded_gpt() {
  torch::manual_seed(7);
  return ampp::train::make_model("gpt-tiny", kOptions);
}

struct Step {
  torch::Tensor loss;
  std::map<std::string, torch::Tensor> grads;
};

Step ampp_step(const Case& c, const torch::Tensor& tokens, const torch::Tensor& targets) {
  auto model = seeded_gpt();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  ampp::Properties props(c.level);
  if (c.level != ampp::OptLevel::O0) props.dtype(c.dtype);
  props.verbosity(0);
  auto amp = ampp::initialize(std::static_pointer_cast<torch::nn::Module>(model), opt, props);
  auto logits = amp.forward(model, tokens).to(torch::kFloat32);
  auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  amp.scale_loss(loss).backward();
  Step s{loss.detach(), {}};
  const auto masters = amp.master_params();  // in the order of model->parameters()
  const auto named = model->named_parameters();
  EXPECT_EQ(masters.size(), named.size());
  for (size_t i = 0; i < std::min(masters.size(), named.size()); ++i)
    s.grads[named[i].key()] = masters[i].grad().to(torch::kFloat32);
  return s;
}

double relative_error(const torch::Tensor& ampp, const torch::Tensor& oracle) {
  return ((ampp.to(torch::kFloat64) - oracle.to(torch::kFloat64)).norm() / oracle.to(torch::kFloat64).norm())
      .item<double>();
}

std::string level_name(const Case& c) { return std::string(ampp::to_string(c.level)) + "/" + c10::toString(c.dtype); }

}  // namespace

TEST(GptStepOracle, LossAndGradientsMatchPyTorchAtEveryOptLevel) {
  torch::set_num_threads(1);           // as the oracle (oracle_common.py): reductions in one order
  const ampp_test::NativeBf16 native;  // PyTorch's bf16 kernels, on any CPU
  torch::manual_seed(11);
  const auto tokens = torch::randint(256, {4, 16}, torch::kLong), targets = torch::randint(256, {4, 16}, torch::kLong);
  json input = {{"config", {{"vocab_size", 256}, {"context", 16}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}}},
                {"tokens", encode(tokens)},
                {"targets", encode(targets)},
                {"cases", json::array()}};
  for (const auto& p : seeded_gpt()->named_parameters()) input["state"][p.key()] = encode(p.value());
  for (const auto& c : kCases)
    input["cases"].push_back({{"level", ampp::to_string(c.level)}, {"dtype", ampp_oracle::dtype_name(c.dtype)}});
  const auto answer = ampp_oracle::run("gpt_step_oracle.py", input);
  if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
  for (size_t i = 0; i < kCases.size(); ++i) {
    const Case& c = kCases[i];
    const Step mine = ampp_step(c, tokens, targets);
    const json& theirs = answer->at("cases").at(i);
    const auto loss = decode(theirs.at("loss"));
    if (c.tolerance == 0) {
      EXPECT_TRUE(ampp_oracle::same_bits(mine.loss, loss)) << level_name(c);
    } else {
      EXPECT_LE(relative_error(mine.loss, loss), c.tolerance) << level_name(c);
    }
    ASSERT_EQ(mine.grads.size(), theirs.at("grads").size()) << level_name(c);
    for (const auto& [name, grad] : mine.grads) {
      const auto oracle = decode(theirs.at("grads").at(name));
      if (c.tolerance == 0) {
        EXPECT_TRUE(ampp_oracle::same_bits(grad, oracle)) << level_name(c) << " " << name;
      } else {
        const double err = relative_error(grad, oracle);
        EXPECT_LE(err, c.tolerance) << level_name(c) << " " << name;
        RecordProperty(level_name(c) + " " + name, std::to_string(err));
      }
    }
  }
}
