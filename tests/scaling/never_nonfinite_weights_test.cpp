// No inf or NaN ever reaches the weights, whatever the scale (docs/grad_scaler.md, "Better than
// PyTorch"). PyTorch checks the gradients before unscaling and lets the scale back off into float32
// subnormals; there 1/scale overflows and finite gradients unscale to inf/NaN that it steps on.

#include "scaler_test_util.h"

#include <gmock/gmock.h>

#include <cmath>
#include <random>

namespace ampp_test {
namespace {

using ampp::GradScaler;
using ampp::GradScalerOptions;
using ampp::kMinLossScale;
using ampp::MinScaleAction;
using ::testing::HasSubstr;

bool all_finite(const torch::Tensor& t) { return torch::isfinite(t).all().item<bool>(); }

// A scale below 1 (inv_scale > 1) unscales a finite 2^126 gradient to 2^128 = inf: PyTorch steps on it.
TEST(NeverNonFiniteWeights, AGradientThatOverflowsWhenUnscaledSkipsTheStep) {
  GradScaler scaler(GradScalerOptions().init_scale(0.25));
  Tiny t;
  t.opt.zero_grad();
  scaler.scale((t.p * torch::arange(1, 5, torch::kFloat)).sum()).backward();
  t.p.mutable_grad()[1].fill_(0x1p126);  // finite before unscaling
  const auto before = t.p.detach().clone();
  EXPECT_FALSE(scaler.step(t.opt));
  EXPECT_TRUE(scaler.found_inf_last_step());
  EXPECT_TRUE(torch::equal(t.p.detach(), before));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 0.125);
}

TEST(NeverNonFiniteWeights, Fp16GradientsThatOverflowWhenUnscaledSkipTheStep) {
  GradScaler scaler(GradScalerOptions().init_scale(0.5).allow_fp16_grads(true));
  auto p = torch::ones({4}, torch::kHalf).requires_grad_();
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.01));
  scaler.scale((p.to(torch::kFloat) * 2).sum()).backward();
  p.mutable_grad()[3].fill_(60000.0);  // finite in fp16; 120000 is not
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_TRUE(all_finite(p.detach()));
}

// From 2^16 it takes 142 halvings to reach 2^-126; the 143rd overflow finds the scale at the floor.
TEST(NeverNonFiniteWeights, BackoffStopsAt2ToTheMinus126AndSaysWhy) {
  GradScaler scaler;
  Tiny t;
  for (int i = 0; i < 142; ++i) ASSERT_FALSE(t.iterate(scaler, true)) << i;
  EXPECT_EQ(scaler.get_scale(), kMinLossScale);
  EXPECT_EQ(scaler.consecutive_overflows(), 142);
  const std::string msg = ampp_test::error_of([&] { t.iterate(scaler, true); });
  EXPECT_THAT(msg, HasSubstr("2^-126"));
  EXPECT_THAT(msg, HasSubstr("overflowed in 143 update(s) in a row"));
  EXPECT_THAT(msg, HasSubstr("not a loss-scale problem"));
  EXPECT_EQ(scaler.get_scale(), kMinLossScale);
  EXPECT_TRUE(all_finite(t.p.detach()));
  // The scaler stays usable: a finite step goes on from the floor.
  EXPECT_TRUE(t.iterate(scaler, false));
  EXPECT_EQ(scaler.consecutive_overflows(), 0);
}

TEST(NeverNonFiniteWeights, ScalesBelowTheFloorAreRefused) {
  AMPP_EXPECT_THROW_WITH(GradScaler s(GradScalerOptions().init_scale(1e-39)), ">= 2^-126");
  GradScaler scaler;
  Tiny t;
  t.iterate(scaler, false);
  AMPP_EXPECT_THROW_WITH(scaler.update(1e-39), ">= 2^-126");
  auto state = scaler.state_dict();
  state.insert_or_assign("scale", 1e-40);
  AMPP_EXPECT_THROW_WITH(scaler.load_state_dict(state), "below 2^-126");
}

// The trial: random overflows (p = 0.5) for 1000+ steps. With growth_interval 2000 the scale
// only backs off, reaching the floor after ~285 steps; at_min_scale(kIgnore) keeps skipping there.
TEST(NeverNonFiniteWeights, ThousandStepsOfRandomOverflowsLeaveEveryWeightFinite) {
  for (int64_t interval : {1, 3, 2000}) {
    SCOPED_TRACE("growth_interval " + std::to_string(interval));
    GradScaler scaler(GradScalerOptions().growth_interval(interval).at_min_scale(MinScaleAction::kIgnore));
    Tiny t;
    std::mt19937 rng(static_cast<unsigned>(interval));
    int injected = 0;
    for (int step = 0; step < 1200; ++step) {
      const bool inject = rng() % 2 == 0;
      injected += inject;
      const float bad = rng() % 2 == 0 ? kInf : kNaN;
      EXPECT_EQ(t.iterate(scaler, inject, bad), !inject) << "step " << step;
      ASSERT_TRUE(all_finite(t.p.detach())) << "step " << step;
    }
    EXPECT_EQ(scaler.skipped_steps(), injected);
    if (interval == 2000) EXPECT_EQ(scaler.get_scale(), kMinLossScale);
    EXPECT_GE(scaler.get_scale(), kMinLossScale);
  }
}

// The numerics doctor's attribution: which parameters' gradients overflowed, by module path.
TEST(NeverNonFiniteWeights, TheOverflowedParametersAreNamed) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::Tanh(), torch::nn::Linear(4, 2));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  auto iterate = [&](const std::vector<std::string>& poisoned) {
    opt.zero_grad();
    scaler.scale(net->forward(torch::randn({5, 3})).sum()).backward();
    for (const auto& name : poisoned) net->named_parameters()[name].mutable_grad().view(-1)[0] = kNaN;
    scaler.step(opt);
    scaler.update();
    return ampp::overflowed_parameter_names(scaler, *net);
  };
  EXPECT_EQ(iterate({"2.weight"}), std::vector<std::string>{"2.weight"});
  EXPECT_EQ(iterate({"0.bias", "2.bias"}), (std::vector<std::string>{"0.bias", "2.bias"}));
  EXPECT_EQ(scaler.overflowed_params().size(), 2u);  // still readable after update()
  EXPECT_TRUE(iterate({}).empty());                  // a clean iteration clears the list
}

}  // namespace
}  // namespace ampp_test
