// The numerics doctor's range report: its counts against what a real conversion to fp16/bf16 does,
// per-step scales, and the recommendation in each of its cases.
#include <ampp/scaling/gradient_ranges.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "../ampp_test.h"

namespace ampp_test {
namespace {

using ampp::GradientRanges;
using ampp::kBf16Range;
using ampp::kFp16Range;
using ampp::RangeCounts;
using Named = std::vector<std::pair<std::string, torch::Tensor>>;

// n values with binary exponents uniform in [lo, hi), random signs and mantissas.
torch::Tensor log_uniform(int64_t n, double lo, double hi, uint64_t seed) {
  torch::manual_seed(seed);
  auto e = torch::rand({n}, torch::kDouble) * (hi - lo) + lo;
  auto sign = torch::randint(0, 2, {n}, torch::kDouble) * 2 - 1;
  return (torch::pow(2.0, e) * sign).to(torch::kFloat);
}

// What a real conversion of g * scale makes of each element.
// Its subnormals exclude the values the report counts as subnormal (by their value before rounding)
// that round up to the smallest normal: those within half a subnormal step below it.
RangeCounts converted(const torch::Tensor& g, double scale, c10::ScalarType dtype, const ampp::FloatRange& range) {
  const int min_normal_exponent = range.min_normal_exponent;
  auto x = (g.to(torch::kDouble) * scale).to(torch::kFloat);
  auto low = x.to(dtype).to(torch::kDouble).abs();
  const double normal = std::ldexp(1.0, min_normal_exponent);
  const auto carried = x.to(torch::kDouble).abs().ge(normal - std::ldexp(1.0, range.min_subnormal_exponent - 1)) &
                       x.to(torch::kDouble).abs().lt(normal);
  RangeCounts c;
  c.elements = g.numel();
  c.zero = g.eq(0).sum().item<int64_t>();
  c.underflow = (g.ne(0) & low.eq(0)).sum().item<int64_t>();
  c.subnormal = (low.gt(0) & low.lt(normal)).sum().item<int64_t>() + carried.sum().item<int64_t>();
  c.overflow = torch::isinf(low).sum().item<int64_t>();
  return c;
}

TEST(GradientRanges, CountsMatchARealConversionToFp16AndBf16) {
  // Exponents from far below bf16's subnormals to above fp16's overflow, at powers of two (counted by
  // shifting the exponents) and at two static scales that are not (counted from the products).
  const auto g = log_uniform(200000, -140, 20, 1);
  for (double scale : {1.0, 256.0, 65536.0, 1000.0, 3e4}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    GradientRanges r;
    r.observe({{"w", g}}, scale, 1.0);
    const auto& p = r.parameters().at(0);
    for (auto [range, dtype] : {std::pair{kFp16Range, torch::kHalf}, std::pair{kBf16Range, torch::kBFloat16}}) {
      SCOPED_TRACE(range.name);
      const RangeCounts ours = r.at_used_scales(p, range);
      const RangeCounts real = converted(g, scale, dtype, range);
      EXPECT_EQ(ours.elements, real.elements);
      EXPECT_EQ(ours.underflow, real.underflow);
      EXPECT_EQ(ours.subnormal, real.subnormal);
      // Counted by exponent, >= 2^16 overflows; the few in [65520, 65536) also round to inf in fp16.
      EXPECT_LE(ours.overflow, real.overflow);
      EXPECT_LE(real.overflow, ours.overflow + ours.near_overflow);
      if (scale == 1.0) EXPECT_GT(ours.underflow, 0);  // the test covers the underflow class
      if (range.name == kFp16Range.name) EXPECT_GT(ours.overflow, 0);
    }
  }
}

TEST(GradientRanges, PowersOfTwoFallInTheirOwnBin) {
  // 2^-14 is fp16's smallest normal; the float just below it is subnormal in fp16.
  const float at = std::ldexp(1.0f, -14), below = std::nextafter(at, 0.0f);
  GradientRanges r;
  r.observe({{"w", torch::tensor({at, below, 0.0f, std::ldexp(1.0f, 15)})}}, 1.0, 1.0);
  const RangeCounts c = r.at_used_scales(r.parameters().at(0), kFp16Range);
  EXPECT_EQ(c.subnormal, 1);
  EXPECT_EQ(c.zero, 1);
  EXPECT_EQ(c.near_overflow, 1);
  EXPECT_EQ(r.highest_exponent({&r.parameters().at(0)}), 15);
}

TEST(GradientRanges, EachStepIsCountedAtItsOwnScale) {
  GradientRanges r;
  const auto g = torch::full({10}, 1.0f);  // 1.0: fine at 2^0, overflows fp16 at 2^16
  r.observe({{"w", g}}, 1.0, 1.0);
  r.observe({{"w", g}}, std::ldexp(1.0, 16), 1.0);
  const auto& p = r.parameters().at(0);
  const RangeCounts used = r.at_used_scales(p, kFp16Range);
  EXPECT_EQ(used.elements, 20);
  EXPECT_EQ(used.overflow, 10);
  EXPECT_EQ(r.total_at(kFp16Range, 0).overflow, 0);  // the true gradients at scale 1
  EXPECT_EQ(r.steps(), 2);
  EXPECT_EQ(r.last_loss_scale(), std::ldexp(1.0, 16));
}

TEST(GradientRanges, NonFiniteElementsAndStepsAreCounted) {
  GradientRanges r;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  r.observe({{"w", torch::tensor({1.0f, inf, nan})}, {"b", torch::Tensor()}}, 65536.0, 2.0);
  r.observe({{"w", torch::tensor({1.0f, 2.0f, 3.0f})}}, 65536.0, 2.0);
  EXPECT_EQ(r.steps_with_non_finite_gradients(), 1);
  EXPECT_EQ(r.non_finite_steps_at_unit_scale(), 0);
  ASSERT_EQ(r.parameters().size(), 1u);  // an undefined gradient is left out
  EXPECT_EQ(r.at_used_scales(r.parameters().at(0), kFp16Range).non_finite, 2);
  // A loss-scale overflow with a finite loss is not a learning-rate problem.
  EXPECT_FALSE(r.recommend().lower_learning_rate);
}

TEST(GradientRanges, RecommendsTheLargestScaleThatLeavesHeadroom) {
  GradientRanges r;
  r.observe({{"fc.weight", log_uniform(10000, -20, -4, 2)}}, 1.0, 0.5);  // largest in [2^-5, 2^-4)
  const auto advice = r.recommend();
  EXPECT_EQ(advice.dtype, "fp16");
  EXPECT_EQ(advice.init_scale, std::ldexp(1.0, 19));  // 2^-5 * 2^19 = 2^14: 2x below 2^15
  EXPECT_TRUE(advice.keep_fp32.empty());
  EXPECT_FALSE(advice.lower_learning_rate);
  EXPECT_EQ(r.total_at(kFp16Range, 19).underflow, 0);
  EXPECT_EQ(r.total_at(kFp16Range, 19).near_overflow, 0);
}

TEST(GradientRanges, RecommendsBf16WhenFp16CannotHoldBothEnds) {
  GradientRanges r;
  // 45 binades in one layer: fp16 spans 40 (2^-24 .. 2^16).
  r.observe({{"net.weight", log_uniform(10000, -45, 0, 3)}}, 1.0, 0.5);
  const auto advice = r.recommend();
  EXPECT_EQ(advice.dtype, "bf16");
  EXPECT_EQ(advice.init_scale, 1.0);
  ASSERT_FALSE(advice.reasons.empty());
  EXPECT_NE(advice.reasons.back().find("fp16 cannot hold both ends"), std::string::npos) << advice.reasons.back();
}

TEST(GradientRanges, NamesTheOneLayerThatDoesNotFitWithTheRest) {
  GradientRanges r;
  r.observe({{"body.weight", log_uniform(10000, -40, -30, 4)},
             {"head.weight", log_uniform(100, 0, 4, 5)},
             {"head.bias", log_uniform(10, -2, 0, 6)}},
            1.0, 0.5);
  const auto advice = r.recommend();
  EXPECT_EQ(advice.dtype, "fp16");
  EXPECT_EQ(advice.keep_fp32, std::vector<std::string>{"head"});
  EXPECT_EQ(advice.init_scale, std::ldexp(1.0, 14 + 31));  // body's largest in [2^-31, 2^-30)
}

TEST(GradientRanges, ADivergingModelIsNotALossScaleProblem) {
  GradientRanges r;
  const float inf = std::numeric_limits<float>::infinity();
  r.observe({{"w", torch::tensor({1.0f, inf})}}, 1.0, std::numeric_limits<double>::infinity());
  const auto advice = r.recommend();
  EXPECT_TRUE(advice.lower_learning_rate);
  EXPECT_NE(advice.reasons.front().find("lower the learning rate"), std::string::npos) << advice.reasons.front();
}

TEST(GradientRanges, ABadScaleIsRefused) {
  GradientRanges r;
  AMPP_EXPECT_THROW_WITH(r.observe({{"w", torch::ones({2})}}, 0.0, 1.0), "positive finite");
  AMPP_EXPECT_THROW_WITH(r.observe({{"w", torch::ones({2})}}, std::nan(""), 1.0), "positive finite");
}

}  // namespace
}  // namespace ampp_test
