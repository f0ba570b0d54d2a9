// Scale trajectories: PyTorch's growth-tracker rule (hand-computed), several optimizers, and the ampp
// policies (static, max cap, min floor, hysteresis).

#include "scaler_test_util.h"

#include <ampp/precision/torch_compat.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>

namespace {

using ampp::GradScaler;
using ampp::GradScalerOptions;
using ampp::MinScaleAction;
using ampp_test::error_of;
using ampp_test::Point;
using ampp_test::Tiny;
using ampp_test::trajectory;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

GradScalerOptions small() { return GradScalerOptions().init_scale(8).growth_interval(3); }

TEST(ScaleTrajectory, ScriptedSequenceFollowsPyTorchsRule) {
  GradScaler scaler(small());
  EXPECT_EQ(scaler.get_scale(), 8.0);  // before lazy init: init_scale
  // F F F(grow) F N(backoff) F F F(grow) N N F
  const std::vector<Point> want = {{8, 1}, {8, 2},  {16, 0}, {16, 1}, {8, 0}, {8, 1},
                                   {8, 2}, {16, 0}, {8, 0},  {4, 0},  {4, 1}};
  EXPECT_THAT(trajectory(scaler, "FFFFNFFFNNF"), ElementsAreArray(want));
}

TEST(ScaleTrajectory, InfMinusInfAndNaNAllSkipAndBackOff) {
  for (float bad : {ampp_test::kInf, -ampp_test::kInf, ampp_test::kNaN}) {
    GradScaler scaler(small());
    Tiny t;
    EXPECT_TRUE(t.iterate(scaler, false));
    EXPECT_FALSE(t.iterate(scaler, true, bad));
    EXPECT_TRUE(scaler.found_inf_last_step());
    EXPECT_EQ(scaler.get_scale(), 4.0);
    EXPECT_EQ(scaler.get_growth_tracker(), 0);
    EXPECT_EQ(scaler.skipped_steps(), 1);
  }
}

TEST(ScaleTrajectory, DefaultsGrowFrom65536AfterExactly2000FiniteSteps) {
  GradScaler scaler;
  auto p = torch::zeros({3}).requires_grad_();
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.0));
  for (int i = 1; i <= 2000; ++i) {
    (void)scaler.scale(torch::ones({}));  // lazy init; the loss itself is not needed here
    p.mutable_grad() = torch::ones({3});
    scaler.step(opt);
    scaler.update();
    if (i == 1999) {
      EXPECT_EQ(scaler.get_scale(), 65536.0);
      EXPECT_EQ(scaler.get_growth_tracker(), 1999);
    }
  }
  EXPECT_EQ(scaler.get_scale(), 131072.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
}

TEST(ScaleTrajectory, LoweringTheIntervalBelowTheTrackerStopsGrowthUntilAnOverflow) {
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(5));
  EXPECT_THAT(trajectory(scaler, "FFF"), ElementsAreArray(std::vector<Point>{{8, 1}, {8, 2}, {8, 3}}));
  scaler.set_growth_interval(2);  // tracker 3 > 2: PyTorch compares with ==, so no growth
  EXPECT_THAT(trajectory(scaler, "FFNFF"),
              ElementsAreArray(std::vector<Point>{{8, 4}, {8, 5}, {4, 0}, {4, 1}, {8, 0}}));
}

TEST(ScaleTrajectory, UpdateWithNewScaleKeepsTheTracker) {
  GradScaler scaler(small());
  trajectory(scaler, "FF");
  Tiny t;
  t.opt.zero_grad();
  scaler.scale((t.p * 2).sum()).backward();
  scaler.step(t.opt);
  scaler.update(1024.0);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 2);
}

TEST(ScaleTrajectory, TwoOptimizersDecideSeparatelyAndBackOffOnce) {
  GradScaler scaler(small());
  auto a = torch::ones({2}).requires_grad_();
  auto b = torch::ones({2}).requires_grad_();
  torch::optim::SGD opt_a({a}, torch::optim::SGDOptions(0.5));
  torch::optim::SGD opt_b({b}, torch::optim::SGDOptions(0.5));
  auto iteration = [&](bool bad_a, bool bad_b) {
    opt_a.zero_grad();
    opt_b.zero_grad();
    scaler.scale(a.sum() + 2 * b.sum()).backward();
    if (bad_a) a.mutable_grad()[0].fill_(ampp_test::kInf);
    if (bad_b) b.mutable_grad()[1].fill_(ampp_test::kNaN);
    const bool sa = scaler.step(opt_a);
    const bool sb = scaler.step(opt_b);
    scaler.update();
    return std::make_pair(sa, sb);
  };
  EXPECT_EQ(iteration(false, true), std::make_pair(true, false));
  EXPECT_EQ(scaler.get_scale(), 4.0);                    // one backoff per update, not per optimizer
  EXPECT_TRUE(torch::equal(a, torch::full({2}, 0.5f)));  // 1 - 0.5 * 1
  EXPECT_TRUE(torch::equal(b, torch::ones({2})));
  EXPECT_EQ(iteration(true, true), std::make_pair(false, false));
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_EQ(scaler.skipped_steps(), 3);
  EXPECT_EQ(iteration(false, false), std::make_pair(true, true));
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
  EXPECT_TRUE(torch::equal(b, torch::zeros({2})));  // 1 - 0.5 * 2
}

TEST(ScalePolicies, StaticScaleNeverChangesButStillSkips) {
  GradScaler scaler(GradScalerOptions().init_scale(128).dynamic(false).growth_interval(2));
  const auto traj = trajectory(scaler, "FFFFFNFNNFFFF");
  for (const auto& p : traj) EXPECT_EQ(p, (Point{128, 0}));
  EXPECT_EQ(scaler.skipped_steps(), 3);
}

TEST(ScalePolicies, MaxScaleCapsGrowth) {
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(1).max_scale(20));
  EXPECT_THAT(trajectory(scaler, "FFFNF"),
              ElementsAreArray(std::vector<Point>{{16, 0}, {20, 0}, {20, 0}, {10, 0}, {20, 0}}));
}

TEST(ScalePolicies, ApexDynamicLossScalerViaOptions) {
  // apex LossScaler("dynamic", max_loss_scale=2^24, min_loss_scale=2^15) with a 2-step window.
  GradScaler scaler(
      GradScalerOptions().init_scale(1 << 23).growth_interval(2).max_scale(1 << 24).min_scale(1 << 15).at_min_scale(
          MinScaleAction::kIgnore));
  EXPECT_THAT(trajectory(scaler, "FFFFN"), ElementsAreArray(std::vector<Point>{
                                               {1 << 23, 1}, {1 << 24, 0}, {1 << 24, 1}, {1 << 24, 0}, {1 << 23, 0}}));
}

TEST(ScalePolicies, MinScaleFloorRaisesWhenOverflowingAtTheFloor) {
  GradScaler scaler(GradScalerOptions().init_scale(12).min_scale(5).growth_interval(3));
  EXPECT_THAT(trajectory(scaler, "NN"), ElementsAreArray(std::vector<Point>{{6, 0}, {5, 0}}));
  Tiny t;
  const auto msg = error_of([&] { t.iterate(scaler, true); });
  EXPECT_THAT(msg, HasSubstr("Current loss scale already at minimum - cannot decrease scale anymore."));
  EXPECT_THAT(msg, HasSubstr("min_scale = 5"));
  EXPECT_THAT(msg, HasSubstr("MinScaleAction::kWarn"));
  EXPECT_EQ(scaler.get_scale(), 5.0);
  // The scaler stays usable: the next iteration starts from READY.
  EXPECT_TRUE(t.iterate(scaler, false));
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
  AMPP_EXPECT_THROW_WITH(t.iterate(scaler, true), "already at minimum");
}

TEST(ScalePolicies, MinScalePatienceCountsConsecutiveOverflowsAtTheFloor) {
  GradScaler scaler(GradScalerOptions().init_scale(4).min_scale(4).min_scale_patience(3));
  Tiny t;
  EXPECT_EQ(error_of([&] { t.iterate(scaler, true); }), "<no error>");
  EXPECT_EQ(error_of([&] { t.iterate(scaler, true); }), "<no error>");
  AMPP_EXPECT_THROW_WITH(t.iterate(scaler, true), "3 consecutive update(s)");
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

// Captures (and drops) every warning while it lives.
struct CapturingHandler {
  std::vector<std::string> messages;
  bool operator()(const std::string& msg) {
    messages.push_back(msg);
    return true;
  }
};

TEST(ScalePolicies, MinScaleWarnWarnsOncePerStreakAndIgnoreIsSilent) {
  CapturingHandler handler;
  ampp::precision::compat::WarningFilter<std::reference_wrapper<CapturingHandler>> capture(std::ref(handler));
  GradScaler warn(GradScalerOptions().init_scale(2).min_scale(2).at_min_scale(MinScaleAction::kWarn));
  trajectory(warn, "NNNFN");
  ASSERT_EQ(handler.messages.size(), 2u);  // streak NNN -> once, F resets, N -> once more
  EXPECT_THAT(handler.messages[0], HasSubstr("already at minimum"));
  EXPECT_EQ(warn.get_scale(), 2.0);
  EXPECT_EQ(warn.skipped_steps(), 4);

  handler.messages.clear();
  GradScaler quiet(GradScalerOptions().init_scale(2).min_scale(2).at_min_scale(MinScaleAction::kIgnore));
  trajectory(quiet, "NNN");
  EXPECT_TRUE(handler.messages.empty());
  EXPECT_EQ(quiet.get_scale(), 2.0);
}

TEST(ScalePolicies, ConsecutiveHysteresisBacksOffOnlyOnTheSecondOverflowInARow) {
  GradScaler scaler(small().hysteresis(2));
  const std::vector<Point> want = {{8, 0}, {4, 0}, {4, 1}, {4, 0}, {4, 1}, {4, 0}, {2, 0}, {2, 1}, {2, 2}, {4, 0}};
  EXPECT_THAT(trajectory(scaler, "NNFNFNNFFF"), ElementsAreArray(want));
  EXPECT_EQ(scaler.skipped_steps(), 5);  // every overflow skips, backoff or not
  EXPECT_EQ(scaler.hysteresis_tracker(), 2);
}

TEST(ScalePolicies, NonConsecutiveHysteresisRefillsOnlyOnGrowth) {
  GradScaler scaler(small().hysteresis(2).consecutive_hysteresis(false));
  const std::vector<Point> want = {{8, 0}, {4, 0},   {4, 1},   {2, 0},   {2, 1},
                                   {1, 0}, {0.5, 0}, {0.5, 1}, {0.5, 2}, {1, 0}};
  EXPECT_THAT(trajectory(scaler, "NNFNFNNFFF"), ElementsAreArray(want));
  EXPECT_EQ(scaler.hysteresis_tracker(), 2);                 // refilled by the growth
  EXPECT_EQ(trajectory(scaler, "N").back(), (Point{1, 0}));  // budget of 2 again
}

TEST(ScalePolicies, PolicyPathWithNeutralSettingsEqualsPyTorchsKernelPath) {
  std::mt19937 rng(1234);
  std::string script;
  for (int i = 0; i < 300; ++i) script += (rng() % 5 == 0) ? 'N' : 'F';
  GradScaler plain(GradScalerOptions().init_scale(1024).growth_interval(4).growth_factor(3).backoff_factor(0.3));
  GradScaler policy(
      GradScalerOptions().init_scale(1024).growth_interval(4).growth_factor(3).backoff_factor(0.3).max_scale(1e30));
  EXPECT_EQ(trajectory(plain, script), trajectory(policy, script));
}

}  // namespace
