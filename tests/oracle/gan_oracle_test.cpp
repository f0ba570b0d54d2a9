// A GAN under one ampp::initialize (two models, two optimizers, three losses, each optimizer stepped with
// amp.step(optimizer)) against a Python twin of apex's loss scaling for several losses and optimizers on
// PyTorch's amp kernels (gan_oracle.py): eight iterations of PyTorch's DCGAN loop, with an overflow in D's loss
// on the fakes at iteration 3 that skips D's step alone. Both models' parameters bit for bit, each loss's
// scale and each optimizer's skipped steps.
#include "oracle/oracle.h"

#include <ampp/amp/initialize.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <vector>

namespace gan_oracle_test {

using ampp_oracle::decode;
using ampp_oracle::encode;
using ampp_oracle::json;

constexpr int kIterations = 8, kInfAt = 3;

torch::Tensor bce(const torch::Tensor& logits, double target) {
  return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, target));
}

std::vector<torch::Tensor> parameters_of(const torch::nn::Sequential& g, const torch::nn::Sequential& d) {
  auto all = g->parameters();
  for (const auto& p : d->parameters()) all.push_back(p);
  return all;
}

// ampp's side: the loop of docs/opt_levels.md ("Several models"), at O0 with dynamic loss scaling (fp32
// arithmetic, as the twin's: what is compared is the scaling of several losses and optimizers).
json ampp_side(const std::vector<torch::Tensor>& reals, const std::vector<torch::Tensor>& noises, json& input) {
  torch::manual_seed(0);
  torch::nn::Sequential g(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 16));
  torch::nn::Sequential d(torch::nn::Linear(16, 32), torch::nn::LeakyReLU(), torch::nn::Linear(32, 1));
  for (const auto& p : parameters_of(g, d)) input["params"].push_back(encode(p.detach()));
  torch::optim::SGD opt_g(g->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD opt_d(d->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto amp = ampp::initialize({g.ptr(), d.ptr()}, {&opt_g, &opt_d},
                              ampp::Properties("O0").loss_scale("dynamic").num_losses(3).verbosity(0));
  json skipped{{"g", 0}, {"d", 0}};
  for (int i = 0; i < kIterations; ++i) {
    amp.zero_grad();
    const auto fake = amp.forward(g, noises[i]);
    amp.scale_loss(bce(amp.forward(d, reals[i]), 1), opt_d, 0).backward();
    auto loss_fake = bce(amp.forward(d, fake.detach()), 0);
    if (i == kInfAt) loss_fake = loss_fake * std::numeric_limits<float>::infinity();
    amp.scale_loss(loss_fake, opt_d, 1).backward();
    if (!amp.step(opt_d)) skipped["d"] = skipped["d"].get<int>() + 1;
    amp.scale_loss(bce(amp.forward(d, fake), 1), opt_g, 2).backward();
    if (!amp.step(opt_g)) skipped["g"] = skipped["g"].get<int>() + 1;
  }
  json out{{"params", json::array()}, {"scales", json::array()}, {"skipped", skipped}};
  for (const auto& p : parameters_of(g, d)) out["params"].push_back(encode(p.detach()));
  for (int id = 0; id < 3; ++id) out["scales"].push_back(amp.loss_scale(id));
  return out;
}

}  // namespace gan_oracle_test

TEST(GanOracle, OneInitializeOverTwoModelsScalesAndStepsAsApexDoes) {
  using namespace gan_oracle_test;
  torch::set_num_threads(1);  // as the oracle (oracle_common.py): one reduction order
  torch::manual_seed(7);
  std::vector<torch::Tensor> reals, noises;
  json input{{"params", json::array()}, {"reals", json::array()}, {"noises", json::array()}, {"inf_at", kInfAt}};
  for (int i = 0; i < kIterations; ++i) {
    reals.push_back(torch::randn({32, 16}) + 2);
    noises.push_back(torch::randn({32, 8}));
    input["reals"].push_back(encode(reals.back()));
    input["noises"].push_back(encode(noises.back()));
  }
  const json ours = ampp_side(reals, noises, input);
  const auto oracle = ampp_oracle::run("gan_oracle.py", json{{"cases", json::array({input})}});
  if (!oracle) GTEST_SKIP() << ampp_oracle::skip_message();
  const auto& want = oracle->at("cases")[0];
  ASSERT_EQ(ours["params"].size(), want["params"].size());
  for (size_t i = 0; i < ours["params"].size(); ++i)
    EXPECT_TRUE(ampp_oracle::same_bits(decode(ours["params"][i]), decode(want["params"][i]))) << "parameter " << i;
  EXPECT_EQ(ours["scales"], want["scales"]);
  EXPECT_EQ(ours["skipped"], want["skipped"]);
  EXPECT_EQ(ours["skipped"]["d"].get<int>(), 1);
  EXPECT_EQ(ours["scales"][1].get<double>(), 32768.0);
}
