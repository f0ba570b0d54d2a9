// The delayed fp8 recipe (ampp::float8_delayed_linear) against a Python twin written from TransformerEngine's
// documented DelayedScaling formula (float8_delayed_oracle.py): six training steps of one Linear, each step's
// output and gradients of x and the weight, one eval forward after them, and the final amax history and
// scales, bit for bit. The steps' magnitudes swing (x times 30, then 0.01, an all-zero x, a tiny x whose
// scale overflows float32), so the history's max, the most recent entry, the margin and the kept scale of an
// all-zero pass all decide a value; history lengths of 1 and 4, float32 and bf16 autocast.
#include "oracle/oracle.h"

#include <ampp/precision/autocast.h>
#include <ampp/precision/float8_delayed.h>
#include <ampp/util/torch_version.h>

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace float8_delayed_oracle_test {

using ampp_oracle::decode;
using ampp_oracle::encode;
using ampp_oracle::json;
using ampp_oracle::same_bits;

struct Case {
  int64_t history_len;
  std::string algo;  // max, most_recent
  int64_t margin;
  std::string mode;  // fp32, autocast_bf16_x, autocast_fp32_x
  std::vector<int64_t> x_shape;
  int64_t out_features;
};

// Each step's x and output-gradient magnitudes.
const std::vector<double> kXScale{1, 30, 0.01, 0, 1e-37, 5};
const std::vector<double> kGScale{1, 1e3, 1e-3, 1, 100, 1};

struct Sequence {
  torch::Tensor weight, bias;
  std::vector<torch::Tensor> xs, gs;
};

Sequence inputs_of(const Case& c, uint64_t seed) {
  std::vector<int64_t> g_shape = c.x_shape;
  g_shape.back() = c.out_features;
  const int64_t k = c.x_shape.back();
  Sequence s;
  const auto first = ampp_oracle::randn_tensors({{c.out_features, k}, {c.out_features}}, seed);
  s.weight = first[0] * 0.1, s.bias = first[1];
  for (size_t i = 0; i < kXScale.size(); ++i) {
    const auto t = ampp_oracle::randn_tensors({c.x_shape, g_shape}, seed + 1 + i);
    s.xs.push_back(t[0] * kXScale[i]);
    s.gs.push_back(t[1] * kGScale[i]);
    if (c.mode == "autocast_bf16_x") s.xs.back() = s.xs.back().to(torch::kBFloat16);
  }
  return s;
}

bool under_autocast(const Case& c) { return c.mode != "fp32"; }

ampp::Float8LinearConfig config_of(const Case& c) {
  return ampp::Float8LinearConfig()
      .recipe(ampp::Float8Recipe::kDelayed)
      .amax_history_len(c.history_len)
      .amax_compute_algo(c.algo == "max" ? ampp::Float8AmaxCompute::kMax : ampp::Float8AmaxCompute::kMostRecent)
      .margin(c.margin);
}

// ampp's side, as the oracle returns it.
json ampp_side(const Case& c, const Sequence& in) {
  const auto config = config_of(c);
  const auto state = ampp::make_float8_delayed_state(c.history_len, torch::kCPU);
  auto weight = in.weight.clone().requires_grad_();
  auto bias = in.bias.clone().requires_grad_();
  json out{{"steps", json::array()}};
  for (size_t i = 0; i < in.xs.size(); ++i) {
    auto x = in.xs[i].clone().requires_grad_();
    weight.mutable_grad() = torch::Tensor();
    std::optional<ampp::autocast> region;
    if (under_autocast(c)) region.emplace(torch::kCPU, torch::kBFloat16);
    auto y = ampp::float8_delayed_linear(x, weight, bias, config, state, /*record=*/true);
    y.backward(in.gs[i].to(y.scalar_type()));
    out["steps"].push_back(
        {{"out", encode(y.detach())}, {"x_grad", encode(x.grad())}, {"weight_grad", encode(weight.grad())}});
  }
  torch::NoGradGuard no_grad;
  std::optional<ampp::autocast> region;
  if (under_autocast(c)) region.emplace(torch::kCPU, torch::kBFloat16);
  out["eval_out"] = encode(ampp::float8_delayed_linear(in.xs.back(), weight, bias, config, state, false));
  out["amax_history"] = encode(state.amax_history);
  out["scale"] = encode(state.scale);
  return out;
}

json oracle_input(const Case& c, const Sequence& s) {
  json one{{"weight", encode(s.weight)},   {"bias", encode(s.bias)},
           {"history_len", c.history_len}, {"algo", c.algo},
           {"margin", c.margin},           {"autocast", under_autocast(c)},
           {"xs", json::array()},          {"gs", json::array()}};
  for (const auto& x : s.xs) one["xs"].push_back(encode(x));
  for (const auto& g : s.gs) one["gs"].push_back(encode(g));
  return one;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> shapes{{{16, 32}, 64}, {{2, 8, 32}, 48}};
  for (const int64_t len : {1, 4})
    for (const std::string algo : {"max", "most_recent"})
      for (const int64_t margin : {0, 1})
        for (const std::string mode : {"fp32", "autocast_bf16_x", "autocast_fp32_x"})
          for (const auto& [x_shape, n] : shapes) all.push_back({len, algo, margin, mode, x_shape, n});
  return all;
}

void expect_same(const json& ours, const json& want, const char* key) {
  EXPECT_TRUE(same_bits(decode(ours.at(key)), decode(want.at(key)))) << key;
}

// Both sides of every case; false where the oracle cannot run here (the test skips).
bool run_cases() {
  torch::set_num_threads(1);  // as the oracle (oracle_common.py): one reduction order
  const auto all = cases();
  json in{{"cases", json::array()}};
  std::vector<json> ours;
  for (size_t i = 0; i < all.size(); ++i) {
    const Sequence s = inputs_of(all[i], 2000 + 10 * i);
    in["cases"].push_back(oracle_input(all[i], s));
    ours.push_back(ampp_side(all[i], s));
  }
  const auto oracle = ampp_oracle::run("float8_delayed_oracle.py", in);
  if (!oracle) return false;
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& c = all[i];
    SCOPED_TRACE("len " + std::to_string(c.history_len) + " " + c.algo + " margin " + std::to_string(c.margin) + " " +
                 c.mode + " case " + std::to_string(i));
    const auto& want = oracle->at("cases")[i];
    for (size_t step = 0; step < kXScale.size(); ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      for (const char* key : {"out", "x_grad", "weight_grad"})
        expect_same(ours[i].at("steps")[step], want.at("steps")[step], key);
    }
    for (const char* key : {"eval_out", "amax_history", "scale"}) expect_same(ours[i], want, key);
  }
  return true;
}

}  // namespace float8_delayed_oracle_test

TEST(Float8DelayedOracle, StepsHistoriesAndScalesAreTheTwinsBitForBit) {
  if (!AMPP_TORCH_AT_LEAST(2, 6)) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  if (!float8_delayed_oracle_test::run_cases()) GTEST_SKIP() << ampp_oracle::skip_message();
}
