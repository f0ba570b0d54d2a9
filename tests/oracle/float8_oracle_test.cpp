// ampp::float8_linear against torchao 0.18's Float8Linear on the CPU (float8_oracle.py): the output and the
// gradients of x, the weight and the bias, bit for bit, for both recipes, over shapes (3-D inputs, a token
// count that is not a multiple of 16), float32 and bf16 modules, bf16 autocast with bf16 and float32 inputs,
// inputs far from 1 and an all-zero input (the amax floor).
#include "oracle/oracle.h"

#include <ampp/precision/autocast.h>
#include <ampp/precision/float8.h>
#include <ampp/util/torch_version.h>

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace float8_oracle_test {

using ampp_oracle::decode;
using ampp_oracle::encode;
using ampp_oracle::json;
using ampp_oracle::same_bits;

struct Case {
  std::string recipe;
  std::vector<int64_t> x_shape;
  int64_t out_features;
  std::string mode;  // fp32, autocast_bf16_x, autocast_fp32_x, bf16_module, no_bias_large_x, zero_x
};

struct Tensors {
  torch::Tensor x, weight, bias, g;
};

Tensors inputs_of(const Case& c, uint64_t seed) {
  const int64_t k = c.x_shape.back();
  std::vector<int64_t> g_shape = c.x_shape;
  g_shape.back() = c.out_features;
  auto t = ampp_oracle::randn_tensors({c.x_shape, {c.out_features, k}, {c.out_features}, g_shape}, seed);
  Tensors in{t[0], t[1] * 0.1, t[2], t[3]};
  if (c.mode == "autocast_bf16_x" || c.mode == "bf16_module") in.x = in.x.to(torch::kBFloat16);
  if (c.mode == "bf16_module") in.weight = in.weight.to(torch::kBFloat16), in.bias = in.bias.to(torch::kBFloat16);
  if (c.mode == "no_bias_large_x") in.x = in.x * 1e3, in.bias = torch::Tensor();
  if (c.mode == "zero_x") in.x = torch::zeros_like(in.x);
  return in;
}

bool under_autocast(const Case& c) { return c.mode.rfind("autocast", 0) == 0; }

// ampp's side: the output and the gradients, as the oracle returns them.
json ampp_side(const Case& c, const Tensors& in) {
  auto x = in.x.clone().requires_grad_();
  auto weight = in.weight.clone().requires_grad_();
  auto bias = in.bias.defined() ? in.bias.clone().requires_grad_() : torch::Tensor();
  json out;
  {
    std::optional<ampp::autocast> region;
    if (under_autocast(c)) region.emplace(torch::kCPU, torch::kBFloat16);
    auto y = ampp::float8_linear(x, weight, bias, ampp::Float8LinearConfig::from_recipe_name(c.recipe));
    y.backward(in.g.to(y.scalar_type()));
    out = {{"out", encode(y.detach())}, {"x_grad", encode(x.grad())}, {"weight_grad", encode(weight.grad())}};
  }
  if (bias.defined()) out["bias_grad"] = encode(bias.grad());
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> shapes{
      {{16, 32}, 64}, {{2, 8, 32}, 64}, {{3, 5, 48}, 80}, {{4, 100, 64}, 128}};
  for (const std::string recipe : {"tensorwise", "rowwise"})
    for (const auto& [x_shape, n] : shapes)
      for (const std::string mode :
           {"fp32", "autocast_bf16_x", "autocast_fp32_x", "bf16_module", "no_bias_large_x", "zero_x"})
        all.push_back({recipe, x_shape, n, mode});
  return all;
}

}  // namespace float8_oracle_test

using namespace float8_oracle_test;

TEST(Float8Oracle, OutputAndGradientsAreTorchaosBitForBit) {
  if (!AMPP_TORCH_AT_LEAST(2, 6)) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  torch::set_num_threads(1);  // as the oracle (oracle_common.py): one reduction order
  const auto all = cases();
  json in{{"cases", json::array()}};
  std::vector<json> ours;
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& c = all[i];
    const Tensors t = inputs_of(c, 1000 + i);
    json one{{"recipe", c.recipe},
             {"x", encode(t.x)},
             {"weight", encode(t.weight)},
             {"g", encode(t.g)},
             {"bf16_module", c.mode == "bf16_module"},
             {"autocast", under_autocast(c)}};
    if (t.bias.defined()) one["bias"] = encode(t.bias);
    in["cases"].push_back(one);
    ours.push_back(ampp_side(c, t));
  }
  const auto oracle = ampp_oracle::run("float8_oracle.py", in);
  if (!oracle) GTEST_SKIP() << ampp_oracle::skip_message();
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& c = all[i];
    SCOPED_TRACE(c.recipe + " " + c.mode + " case " + std::to_string(i));
    const auto& want = oracle->at("cases")[i];
    for (const char* key : {"out", "x_grad", "weight_grad", "bias_grad"}) {
      if (!want.contains(key)) continue;
      EXPECT_TRUE(same_bits(decode(ours[i].at(key)), decode(want.at(key)))) << key;
    }
  }
}
