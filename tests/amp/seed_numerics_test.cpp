// The seeds' numerics: why FP32 master weights. A small update to a weight of 1.0 vanishes when the
// weight itself is stored in bf16/fp16 (O3) and survives in the FP32 master (O2).
#include <ampp/amp/initialize.h>

#include "ampp_test.h"

#include <torch/torch.h>

#include <cmath>

namespace {

struct WeightImpl : torch::nn::Module {
  WeightImpl() : lin(register_module("lin", torch::nn::Linear(torch::nn::LinearOptions(1, 1).bias(false)))) {
    torch::NoGradGuard no_grad;
    lin->weight.fill_(1.0);
  }
  torch::Tensor forward(const torch::Tensor& x) { return lin(x); }
  torch::nn::Linear lin;
};
TORCH_MODULE(Weight);

struct Outcome {
  float model_weight;
  float master_weight;
  int64_t skipped;
};

// loss = w * x with x = 1e-4 and SGD lr = 1: each step subtracts 1e-4 (x rounded to the dtype) from w.
Outcome train(ampp::OptLevel level, c10::ScalarType dtype, int steps) {
  Weight model;
  torch::optim::SGD opt(model->parameters(), /*lr=*/1.0);
  auto amp = ampp::initialize(model, opt, ampp::Properties(level).dtype(dtype).verbosity(0));
  const auto x = torch::full({1, 1}, 1e-4);
  for (int i = 0; i < steps; ++i) {
    amp.zero_grad();
    auto loss = amp.forward(model, x).sum();
    amp.scale_loss(loss).backward();
    amp.step();
  }
  return {model->lin->weight.item<float>(), amp.master_params(opt)[0].item<float>(), amp.skipped_steps()};
}

float rounded(double v, c10::ScalarType dtype) { return torch::tensor(v).to(dtype).to(torch::kFloat).item<float>(); }

}  // namespace

TEST(SeedNumerics, TwoToTheMinus14IsLostInFp16AndKeptInFp32) {
  const double a = std::ldexp(1.0, -3), b = std::ldexp(1.0, -14), c = std::ldexp(1.0, -13);
  EXPECT_EQ((torch::tensor(a) + torch::tensor(b)).item<double>(), a + b);  // fp32 keeps it
  auto half_sum = torch::tensor(a).to(torch::kHalf) + torch::tensor(b).to(torch::kHalf);
  EXPECT_EQ(half_sum.scalar_type(), torch::kHalf);
  EXPECT_EQ(half_sum.item<double>(), a);  // fp16 spacing in [2^-3, 2^-2) is 2^-13: the 2^-14 vanishes
  auto half_sum2 = torch::tensor(a).to(torch::kHalf) + torch::tensor(c).to(torch::kHalf);
  EXPECT_EQ(half_sum2.item<double>(), a + c);  // one full spacing survives
}

class SmallUpdates : public ::testing::TestWithParam<c10::ScalarType> {};

TEST_P(SmallUpdates, LostInPureLowPrecisionO3) {
  const auto out = train(ampp::OptLevel::O3, GetParam(), 50);
  EXPECT_EQ(out.model_weight, 1.0f);   // 1 - 1e-4 rounds back to 1 every time
  EXPECT_EQ(out.master_weight, 1.0f);  // O3 has no master: the optimizer steps the model itself
}

TEST_P(SmallUpdates, KeptInFp32MasterWeightsO2) {
  const int steps = 100;
  const auto out = train(ampp::OptLevel::O2, GetParam(), steps);
  const double x = rounded(1e-4, GetParam());  // the input is cast to the model dtype
  // fp16 only: the first backward overflows (d loss / d out = scale = 65536 > 65504) and is skipped.
  EXPECT_EQ(out.skipped, GetParam() == torch::kHalf ? 1 : 0);
  const double expected = 1.0 - (steps - out.skipped) * x;
  EXPECT_NEAR(out.master_weight, expected, 1e-6);
  EXPECT_LT(out.master_weight, 0.9905f);
  // The model holds the master rounded to its dtype: it moved too, by whole low-precision steps.
  EXPECT_EQ(out.model_weight, rounded(out.master_weight, GetParam()));
  EXPECT_LT(out.model_weight, 1.0f);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SmallUpdates, ::testing::Values(torch::kBFloat16, torch::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });
