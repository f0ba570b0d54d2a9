// ampp's fused path (FusedSGD, FusedAdamW under GradScaler) against torch.optim.SGD/AdamW(fused=True)
// under torch.amp.GradScaler("cpu"): the parameters, the scale and the growth tracker after every step,
// bit for bit, with inf and NaN gradients injected and explicit unscale_ on some steps.
#include "oracle/oracle.h"

#include <ampp/scaling/fused_optimizers.h>
#include <ampp/scaling/grad_scaler.h>

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <set>

namespace {

using ampp_oracle::bits_double;
using ampp_oracle::decode;
using ampp_oracle::double_bits;
using ampp_oracle::encode;
using ampp_oracle::json;
using ampp_oracle::same_bits;

constexpr int kSteps = 30;
constexpr double kLr = 0.01;
constexpr double kInitScale = 65536.0;
constexpr int64_t kGrowthInterval = 3;
const std::vector<std::vector<int64_t>> kShapes{{5}, {3, 4}, {2}};
const std::set<int> kOverflowSteps{3, 7, 8, 20};  // never step 0: see FusedSgd.AFirstStepThatOverflows...

struct Step {
  std::vector<torch::Tensor> grads;
  bool unscale;
};

std::vector<Step> make_steps(uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  ampp_oracle::Rng rng(seed);
  const float bad[] = {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  std::vector<Step> steps;
  for (int s = 0; s < kSteps; ++s) {
    Step step{{}, s % 4 == 1};
    for (const auto& shape : kShapes)
      step.grads.push_back(torch::randn(shape, gen) * std::pow(10.0, static_cast<double>(rng.integer(-2, 2))));
    if (kOverflowSteps.count(s)) step.grads[static_cast<size_t>(s) % kShapes.size()].view(-1)[0] = bad[s % 2];
    steps.push_back(std::move(step));
  }
  return steps;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<torch::Tensor> params) {
  if (kind == "sgd")
    return std::make_unique<ampp::FusedSGD>(params, torch::optim::SGDOptions(kLr).momentum(0.9).weight_decay(1e-4));
  if (kind == "sgd_nesterov")
    return std::make_unique<ampp::FusedSGD>(params, torch::optim::SGDOptions(kLr).momentum(0.9).nesterov(true));
  if (kind == "adamw") return std::make_unique<ampp::FusedAdamW>(params, torch::optim::AdamWOptions(kLr));
  return std::make_unique<ampp::FusedAdamW>(params, torch::optim::AdamWOptions(kLr).amsgrad(true).weight_decay(0.1));
}

json case_json(const std::string& kind, const std::vector<torch::Tensor>& params, const std::vector<Step>& steps) {
  json c = {{"optimizer", kind},
            {"lr", double_bits(kLr)},
            {"init_scale", double_bits(kInitScale)},
            {"growth_interval", kGrowthInterval},
            {"params", json::array()},
            {"steps", json::array()}};
  for (const auto& p : params) c["params"].push_back(encode(p));
  for (const auto& s : steps) {
    json step = {{"unscale", s.unscale}, {"grads", json::array()}};
    for (const auto& g : s.grads) step["grads"].push_back(encode(g));
    c["steps"].push_back(step);
  }
  return c;
}

// One optimizer kind through ampp, compared with the oracle after every step.
void compare_case(const std::string& kind, const std::vector<torch::Tensor>& init, const std::vector<Step>& steps,
                  const json& oracle) {
  SCOPED_TRACE(kind);
  std::vector<torch::Tensor> params;
  for (const auto& p : init) params.push_back(p.clone().requires_grad_());
  auto opt = make_optimizer(kind, params);
  ampp::GradScaler scaler(ampp::GradScalerOptions().init_scale(kInitScale).growth_interval(kGrowthInterval));
  for (size_t s = 0; s < steps.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    opt->zero_grad();
    auto loss = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i] * steps[s].grads[i]).sum();
    scaler.scale(loss).backward();
    if (steps[s].unscale) scaler.unscale_(*opt);
    scaler.step(*opt);
    scaler.update();
    const json& want = oracle.at("steps").at(s);
    for (size_t i = 0; i < params.size(); ++i)
      ASSERT_TRUE(same_bits(params[i].detach(), decode(want.at("params").at(i)))) << "parameter " << i;
    ASSERT_EQ(double_bits(scaler.get_scale()), want.at("scale").get<uint64_t>()) << "scale " << scaler.get_scale();
    ASSERT_EQ(scaler.get_growth_tracker(), want.at("growth_tracker").get<int64_t>());
  }
  EXPECT_EQ(scaler.skipped_steps(), static_cast<int64_t>(kOverflowSteps.size()));
  if (auto* adamw = dynamic_cast<ampp::FusedAdamW*>(opt.get())) {
    adamw->sync_step_counts();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& state =
          static_cast<const torch::optim::AdamWParamState&>(*adamw->state().at(ampp::optimizer_state_key(params[i])));
      EXPECT_EQ(state.step(), oracle.at("adam_steps").at(i).get<int64_t>()) << "AdamW step count of parameter " << i;
    }
  }
}

}  // namespace

TEST(FusedStepOracle, SgdAndAdamWMatchPyTorchsFusedOptimizersUnderGradScaler) {
  const std::vector<std::string> kinds{"sgd", "sgd_nesterov", "adamw", "adamw_amsgrad"};
  const auto init = ampp_oracle::randn_tensors(kShapes, 11);
  const auto steps = make_steps(12);
  json in = {{"cases", json::array()}};
  for (const auto& kind : kinds) in["cases"].push_back(case_json(kind, init, steps));
  const auto oracle = ampp_oracle::run("fused_step_oracle.py", in);
  if (!oracle) GTEST_SKIP() << ampp_oracle::skip_message();
  for (size_t k = 0; k < kinds.size(); ++k) compare_case(kinds[k], init, steps, oracle->at("cases").at(k));
}

// PyTorch's fused SGD leaves its momentum buffers uninitialised when the first step overflows (the
// kernel skips the copy of the gradients into them); ampp starts them at zero. After an overflowing
// first step, ampp's weights are those of a run that never had that step: PyTorch's own fused SGD from
// the next step on, with the scale that the backoff left (powers of two: the unscale is exact).
TEST(FusedStepOracle, AFirstStepThatOverflowsLeavesTheMomentumAsIfItNeverHappened) {
  const auto init = ampp_oracle::randn_tensors(kShapes, 21);
  auto steps = make_steps(22);
  std::vector<Step> without_first(steps.begin() + 1, steps.begin() + 10);
  for (auto& s : without_first) s.unscale = false;
  json c = case_json("sgd", init, without_first);
  c["init_scale"] = double_bits(kInitScale / 2);  // what the first step's backoff leaves
  c["growth_interval"] = 1000;
  const auto oracle = ampp_oracle::run("fused_step_oracle.py", json{{"cases", json::array({c})}});
  if (!oracle) GTEST_SKIP() << ampp_oracle::skip_message();

  std::vector<torch::Tensor> params;
  for (const auto& p : init) params.push_back(p.clone().requires_grad_());
  ampp::FusedSGD opt(params, torch::optim::SGDOptions(kLr).momentum(0.9).weight_decay(1e-4));
  ampp::GradScaler scaler(ampp::GradScalerOptions().init_scale(kInitScale).growth_interval(1000));
  for (size_t s = 0; s < 10; ++s) {
    opt.zero_grad();
    auto loss = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i)
      loss = loss + (params[i] * (s == 0 ? torch::full_like(params[i], INFINITY) : steps[s].grads[i])).sum();
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  }
  EXPECT_EQ(scaler.skipped_steps(), 1 + 3);  // the first, and steps 3, 7 and 8 (kOverflowSteps)
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(same_bits(params[i].detach(), decode(oracle->at("cases").at(0).at("steps").back().at("params").at(i))))
        << "parameter " << i;
}
