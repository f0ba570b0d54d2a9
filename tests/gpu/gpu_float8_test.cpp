// ampp::float8_linear on a GPU (fp8 tensor cores through at::_scaled_mm: Hopper or newer) against the same
// call on the CPU, which is torchao's to the bit (Float8Oracle). The GPU's kernels accumulate in their own
// order (the forward with fast accumulation), so the two agree to fp8's precision, not bit for bit: the
// check is that the GPU path takes its operands' layouts and scales, in both recipes, with bf16 CUDA
// autocast (x cast first, as torchao does), and that its gradients are the CPU's.
#include <ampp/precision/autocast.h>
#include <ampp/precision/float8.h>
#include <ampp/precision/float8_linear.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace gpu_float8_test {

struct Result {
  torch::Tensor out, x_grad, weight_grad, bias_grad;
};

Result run_on(const torch::Device& device, const torch::Tensor& x_cpu, const torch::Tensor& w_cpu,
              const torch::Tensor& b_cpu, const torch::Tensor& g_cpu, const std::string& recipe, bool autocast) {
  auto x = x_cpu.to(device).requires_grad_(), w = w_cpu.to(device).requires_grad_(),
       b = b_cpu.to(device).requires_grad_();
  std::optional<ampp::autocast> region;
  if (autocast) region.emplace(device.type(), torch::kBFloat16);
  auto y = ampp::float8_linear(x, w, b, ampp::Float8LinearConfig::from_recipe_name(recipe));
  y.backward(g_cpu.to(device).to(y.scalar_type()));
  return {y.detach().cpu().to(torch::kFloat), x.grad().cpu().to(torch::kFloat), w.grad().cpu(), b.grad().cpu()};
}

double relative_gap(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace gpu_float8_test

using namespace gpu_float8_test;

TEST(GpuFloat8, BothRecipesOnTheGpuAgreeWithTheCpuToFp8Precision) {
  AMPP_REQUIRE_GPU();
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  // fp8 tensor cores need compute capability 8.9 or newer: the suite's machines are Hopper (H100, H200).
  torch::manual_seed(0);
  // Every size a multiple of 16, as the GPU's kernels need (K, N, and M = tokens for g^T x).
  const auto x = torch::randn({4, 64, 256}), w = torch::randn({512, 256}) * 0.05, b = torch::randn({512});
  const auto g = torch::randn({4, 64, 512});
  for (const std::string recipe : {"tensorwise", "rowwise"}) {
    for (const bool autocast : {false, true}) {
      SCOPED_TRACE(recipe + (autocast ? " under bf16 autocast" : " in float32"));
      const auto cpu = run_on(torch::kCPU, x, w, b, g, recipe, autocast);
      const auto gpu = run_on(torch::Device(torch::kCUDA, 0), x, w, b, g, recipe, autocast);
      // bf16 outputs (rowwise, autocast) carry 8 bits: a 2^-7 relative step; fp8's own rounding is shared.
      EXPECT_LT(relative_gap(gpu.out, cpu.out), 2e-2);
      EXPECT_LT(relative_gap(gpu.x_grad, cpu.x_grad), 2e-2);
      EXPECT_LT(relative_gap(gpu.weight_grad, cpu.weight_grad), 2e-2);
      EXPECT_LT(relative_gap(gpu.bias_grad, cpu.bias_grad), 2e-2);
      EXPECT_EQ(gpu.weight_grad.scalar_type(), torch::kFloat);
    }
  }
}

// Shapes that are not multiples of 16 (issue 52, defect 4): 15 tokens (the weight gradient's inner dimension,
// g^T x), 40 input and 24 output features. CUDA's _scaled_mm refuses them unpadded; ampp pads them with zeros.
TEST(GpuFloat8, ShapesThatAreNotMultiplesOf16ArePaddedAndAgreeWithTheCpu) {
  AMPP_REQUIRE_GPU();
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  torch::manual_seed(2);
  const auto x = torch::randn({3, 5, 40}), w = torch::randn({24, 40}) * 0.05, b = torch::randn({24});
  const auto g = torch::randn({3, 5, 24});
  for (const std::string recipe : {"tensorwise", "rowwise"}) {
    SCOPED_TRACE(recipe);
    const auto cpu = run_on(torch::kCPU, x, w, b, g, recipe, /*autocast=*/true);
    Result gpu;
    ASSERT_NO_THROW(gpu = run_on(torch::Device(torch::kCUDA, 0), x, w, b, g, recipe, /*autocast=*/true));
    EXPECT_LT(relative_gap(gpu.out, cpu.out), 2e-2);
    EXPECT_LT(relative_gap(gpu.x_grad, cpu.x_grad), 2e-2);
    EXPECT_LT(relative_gap(gpu.weight_grad, cpu.weight_grad), 2e-2);
  }
}

// The delayed recipe on the GPU: three steps of a Float8Linear whose state lives on the device. The amaxes are
// those of the same tensors, so the histories and scales are the CPU's bit for bit; the products agree to
// fp8's precision.
TEST(GpuFloat8, TheDelayedRecipesStateOnTheGpuIsTheCpus) {
  AMPP_REQUIRE_GPU();
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  torch::manual_seed(1);
  const auto w = torch::randn({512, 256}) * 0.05;
  std::vector<torch::Tensor> xs, gs;
  for (int i = 0; i < 3; ++i) xs.push_back(torch::randn({256, 256}) * (i + 1)), gs.push_back(torch::randn({256, 512}));
  auto run = [&](const torch::Device& device) {
    ampp::Float8Linear layer(256, 512);
    {
      torch::NoGradGuard no_grad;
      layer->weight.copy_(w);
    }
    layer->set_float8(ampp::Float8LinearConfig().recipe(ampp::Float8Recipe::kDelayed).amax_history_len(4));
    layer->to(device);
    torch::Tensor out;
    for (int i = 0; i < 3; ++i) {
      auto y = layer(xs[i].to(device));
      y.backward(gs[i].to(device));
      out = y.detach().cpu();
    }
    return std::vector<torch::Tensor>{out, layer->delayed_state().amax_history.cpu(),
                                      layer->delayed_state().scale.cpu()};
  };
  const auto cpu = run(torch::kCPU), gpu = run(torch::Device(torch::kCUDA, 0));
  EXPECT_LT(relative_gap(gpu[0], cpu[0]), 2e-2);
  EXPECT_TRUE(torch::equal(gpu[1], cpu[1])) << gpu[1] << cpu[1];
  EXPECT_TRUE(torch::equal(gpu[2], cpu[2])) << gpu[2] << cpu[2];
}
