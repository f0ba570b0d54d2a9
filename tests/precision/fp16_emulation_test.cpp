// fp16 on CPU: values and gradients crossing lower-precision ops are IEEE-half values.

#include "precision/test_util.h"

#include <ampp/precision/autocast.h>
#include <ampp/precision/rounding.h>
#include <ampp/scaling/grad_scaler.h>

#include <cmath>

namespace {

using Fp16Emulation = ampp_test::OneThread;

TEST_F(Fp16Emulation, RoundingFollowsIeeeHalf) {
  const float s = std::ldexp(1.0f, -24);  // smallest fp16 subnormal
  auto x = torch::tensor({65504.0f, 65519.0f, 65520.0f, -70000.0f, s, 0.5f * s, 0.75f * s, 1.5f * s,
                          std::ldexp(1.0f, -14), 1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11)});
  auto r = ampp::precision::round_to_fp16(x);
  EXPECT_EQ(r.scalar_type(), torch::kFloat);
  auto v = [&](int i) { return r[i].item<float>(); };
  EXPECT_EQ(v(0), 65504.0f);                  // max finite
  EXPECT_EQ(v(1), 65504.0f);                  // below the rounding midpoint to 2^16
  EXPECT_TRUE(std::isinf(v(2)) && v(2) > 0);  // 65520 rounds up to 2^16: overflow
  EXPECT_TRUE(std::isinf(v(3)) && v(3) < 0);
  EXPECT_EQ(v(4), s);
  EXPECT_EQ(v(5), 0.0f);                          // 2^-25: tie, rounds to even (zero): underflow
  EXPECT_EQ(v(6), s);                             // 0.75 * 2^-24 rounds up to 2^-24
  EXPECT_EQ(v(7), 2 * s);                         // 1.5 * 2^-24: tie, rounds to even (2 * 2^-24)
  EXPECT_EQ(v(8), std::ldexp(1.0f, -14));         // smallest normal
  EXPECT_EQ(v(9), 1.0f);                          // 1 + 2^-11: tie between 1 and 1 + 2^-10, to even
  EXPECT_EQ(v(10), 1.0f + std::ldexp(1.0f, -9));  // 1 + 3*2^-11: tie, to even (1 + 2^-9)
}

// Seed 002: 2^-3 + 2^-14 is lost in fp16 (spacing in [2^-3, 2^-2) is 2^-13) and kept in fp32.
TEST_F(Fp16Emulation, SmallAddendLostInFp16KeptInFp32) {
  const float a = std::ldexp(1.0f, -3), b = std::ldexp(1.0f, -14), c = std::ldexp(1.0f, -13);
  auto ones = torch::ones({2, 1});
  auto sum_of = [&](float x, float y) { return torch::mm(torch::tensor({{x, y}}), ones).item<float>(); };
  EXPECT_EQ(sum_of(a, b), 0.12506103515625f);  // fp32, no region
  {
    ampp::autocast guard(torch::kCPU, torch::kHalf);
    EXPECT_EQ(sum_of(a, b), 0.125f);
    EXPECT_EQ(sum_of(a, c), 0.1251220703125f);  // 2^-13 is one fp16 step: kept
  }
  {
    ampp::autocast guard(torch::kCPU, torch::kBFloat16);  // bf16 spacing there is 2^-10: also lost
    EXPECT_EQ(sum_of(a, b), 0.125f);
  }
}

TEST_F(Fp16Emulation, LoweredOpsRoundInputsAndOutputsOnly) {
  // Inputs are rounded before the fp32 product: 1 + 2^-12 becomes 1 in fp16.
  const float tiny = std::ldexp(1.0f, -12);
  auto x = torch::tensor({{1.0f + tiny}});
  auto w = torch::tensor({{3.0f}});
  ampp::autocast guard(torch::kCPU, torch::kHalf);
  EXPECT_EQ(torch::mm(x, w).item<float>(), 3.0f);
  // Overflow: 300 * 300 = 90000 > 65504 becomes inf in the output.
  EXPECT_TRUE(std::isinf(torch::mm(torch::tensor({{300.0f}}), torch::tensor({{300.0f}})).item<float>()));
  // Ops outside the lists are not rounded (documented difference from real fp16 kernels).
  EXPECT_EQ(torch::add(x, 0.0f).item<float>(), 1.0f + tiny);
  // fp32-list ops compute in fp32.
  EXPECT_EQ(torch::mse_loss(x, torch::ones({1, 1})).item<float>(), tiny * tiny);
}

TEST_F(Fp16Emulation, GradientsCrossingLoweredOpsAreRoundedToFp16) {
  auto w = torch::ones({1, 1}, torch::requires_grad());
  auto x = torch::ones({1, 1});
  {
    ampp::autocast guard(torch::kCPU, torch::kHalf);
    auto y = torch::mm(x, w);
    // d(loss)/dy = 2^-26 underflows to 0 when the output rounding is differentiated.
    (y.sum() * std::ldexp(1.0f, -26)).backward();
  }
  EXPECT_EQ(w.grad().item<float>(), 0.0f);
  w.mutable_grad() = torch::Tensor();
  {
    ampp::autocast guard(torch::kCPU, torch::kHalf);
    auto y = torch::mm(x, w);
    (y.sum() * std::ldexp(1.0f, -24)).backward();  // smallest subnormal survives
  }
  EXPECT_EQ(w.grad().item<float>(), std::ldexp(1.0f, -24));
}

// A model whose gradients underflow to exactly zero in fp16 gets correct gradients when the loss is
// scaled (65536) and the gradients are divided back, as GradScaler does.
TEST_F(Fp16Emulation, LossScalingRecoversUnderflowingGradients) {
  torch::manual_seed(2);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
  const auto x = torch::randn({8, 16});
  const auto target = torch::randn({8, 4});
  // d(loss)/d(output) ~ 2|y - t| / 32 * tiny: below 2^-25 (flushed to zero by fp16) unscaled, in
  // fp16's normal range (> 2^-14) for most elements once multiplied by 65536.
  const float tiny = 1e-7f;  // e.g. a loss averaged over a huge number of terms
  auto grads = [&](bool autocast, float scale) {
    net->zero_grad();
    torch::Tensor loss;
    {
      ampp::autocast guard(torch::kCPU, torch::kHalf, autocast);
      loss = torch::mse_loss(net->forward(x), target) * tiny;
    }
    (loss * scale).backward();
    std::vector<torch::Tensor> out;
    for (const auto& p : net->parameters()) out.push_back(p.grad().clone() / scale);
    return out;
  };
  const auto reference = grads(false, 1.0f);
  const auto unscaled = grads(true, 1.0f);
  const auto scaled = grads(true, 65536.0f);
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_GT(reference[i].abs().max().item<float>(), 0.0f);
    EXPECT_EQ(unscaled[i].abs().max().item<float>(), 0.0f) << "parameter " << i << " should underflow";
    const float rel = ((scaled[i] - reference[i]).norm() / reference[i].norm()).item<float>();
    EXPECT_LT(rel, 1e-2f) << "parameter " << i;
  }
}

// The same with ampp::GradScaler (scale 65536, unscale_ before reading the gradients).
TEST_F(Fp16Emulation, GradScalerRecoversUnderflowingGradients) {
  torch::manual_seed(2);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
  torch::optim::SGD opt(net->parameters(), 0.1);
  const auto x = torch::randn({8, 16});
  const auto target = torch::randn({8, 4});
  auto loss_of = [&](bool autocast) {
    ampp::autocast guard(torch::kCPU, torch::kHalf, autocast);
    return torch::mse_loss(net->forward(x), target) * 1e-7f;
  };
  std::vector<torch::Tensor> reference;
  opt.zero_grad();
  loss_of(false).backward();
  for (const auto& p : net->parameters()) reference.push_back(p.grad().clone());

  ampp::GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  opt.zero_grad();
  scaler.scale(loss_of(true)).backward();
  scaler.unscale_(opt);
  const auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& g = params[i].grad();
    EXPECT_GT(g.abs().max().item<float>(), 0.0f);
    EXPECT_LT(((g - reference[i]).norm() / reference[i].norm()).item<float>(), 1e-2f) << "parameter " << i;
  }
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 65536.0);  // finite gradients: no backoff
}

}  // namespace
