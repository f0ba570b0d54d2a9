// CUDA's rules for _scaled_mm held on the CPU (issue 52, defect 4): inner and output dimensions that are not
// multiples of 16 (an odd token count, batch or --grad-accum in the weight gradient g^T x) are padded with
// zeros, the padded operands pass CUDA's checks on every device, and the product is the unpadded one's.

#include <ampp/precision/float8.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ampp/precision/float8_kernels.h"
#include "ampp_test.h"

namespace {

using ampp::detail::check_cuda_scaled_mm_operands;
using ampp::detail::Float8Operand;
using ampp::detail::scaled_mm_operands;

Float8Operand tensorwise(const torch::Tensor& t) {
  const auto scale = ampp::float8_scale(t, torch::kFloat8_e4m3fn, std::nullopt, /*power_of_2=*/false);
  return {ampp::to_float8(t, scale, torch::kFloat8_e4m3fn), scale};
}

TEST(Float8CudaShapes, OddDimensionsArePaddedWithZerosInCudasLayouts) {
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  torch::manual_seed(0);
  const auto a = tensorwise(torch::randn({7, 15})), b = tensorwise(torch::randn({15, 24}).t().contiguous().t());
  // Unpadded, CUDA would refuse them: the CPU says so too.
  AMPP_EXPECT_THROW_WITH(check_cuda_scaled_mm_operands(a.data, b.data), "multiples of 16");
  const auto [pa, pb] = scaled_mm_operands(a, b);
  EXPECT_EQ(pa.data.sizes(), (std::vector<int64_t>{7, 16}));
  EXPECT_EQ(pb.data.sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_NO_THROW(check_cuda_scaled_mm_operands(pa.data, pb.data));
  EXPECT_TRUE(torch::equal(pa.data.narrow(1, 0, 15).to(torch::kFloat), a.data.to(torch::kFloat)));
  EXPECT_EQ(pa.data.narrow(1, 15, 1).to(torch::kFloat).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(pb.data.narrow(0, 15, 1).to(torch::kFloat).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(pb.data.narrow(1, 24, 8).to(torch::kFloat).abs().sum().item<float>(), 0.0f);
}

TEST(Float8CudaShapes, ARowwiseScaleOfPaddedColumnsIsPaddedWithOnes) {
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  const auto b_values = torch::randn({16, 10});
  const auto scale = ampp::float8_scale(b_values, torch::kFloat8_e4m3fn, /*dim=*/0, /*power_of_2=*/false);  // [1, 10]
  const Float8Operand b{ampp::to_float8(b_values, scale, torch::kFloat8_e4m3fn), scale};
  const Float8Operand a = tensorwise(torch::randn({4, 16}));
  const auto padded_b = scaled_mm_operands(a, b).second;
  ASSERT_EQ(padded_b.scale.sizes(), (std::vector<int64_t>{1, 16}));
  EXPECT_TRUE(torch::equal(padded_b.scale.narrow(1, 0, 10), scale));
  EXPECT_TRUE(torch::equal(padded_b.scale.narrow(1, 10, 6), torch::ones({1, 6})));
}

// A Float8Linear over 15 tokens: forward and backward as before on the CPU, whose product is the unpadded one.
TEST(Float8CudaShapes, FifteenTokensTrainOnTheCpuWithTheUnpaddedProducts) {
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  torch::manual_seed(3);
  const auto a = tensorwise(torch::randn({24, 15})), b = tensorwise(torch::randn({15, 40}));
  const auto product = ampp::detail::float8_scaled_mm(a, b, torch::kFloat, /*fast_accum=*/false);
  const auto expected =
      (a.data.to(torch::kFloat) * a.scale.reciprocal()).mm(b.data.to(torch::kFloat) * b.scale.reciprocal());
  EXPECT_TRUE(torch::equal(product, expected));
}

}  // namespace
