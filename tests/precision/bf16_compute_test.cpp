// Hardware-aware bf16: detection, the automatic choice, and Bf16Compute::kFp32 (bf16 storage, fp32
// GEMMs/convolutions) against hand-built fp32 references.

#include "ampp_test.h"
#include "precision/test_util.h"

#include <ampp/precision/autocast.h>
#include <ampp/precision/cpu_features.h>
#include <ampp/precision/rounding.h>

#include <fstream>
#include <sstream>

namespace {

using Bf16Compute = ampp_test::OneThread;

bool cpuinfo_has_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::string w;
    while (words >> w)
      if (w == flag) return true;
    return false;
  }
  return false;
}

TEST_F(Bf16Compute, DetectionMatchesProcCpuinfo) {
  std::ifstream probe("/proc/cpuinfo");
  if (!probe || !cpuinfo_has_flag("avx512f")) GTEST_SKIP() << "not an x86 Linux machine with AVX-512";
  const auto& s = ampp::precision::cpu_bf16_support();
  EXPECT_EQ(s.avx512_bf16, cpuinfo_has_flag("avx512_bf16"));
  EXPECT_EQ(s.amx_bf16, cpuinfo_has_flag("amx_bf16"));
}

TEST_F(Bf16Compute, AutomaticFollowsTheHardwareAndCanBeOverridden) {
  if (std::getenv("AMPP_BF16_COMPUTE")) GTEST_SKIP() << "AMPP_BF16_COMPUTE overrides the hardware choice";
  const auto expected =
      ampp::precision::cpu_bf16_support().any() ? ampp::Bf16Compute::kNative : ampp::Bf16Compute::kFp32;
  EXPECT_EQ(ampp::default_bf16_compute(), expected);
  {
    ampp::autocast guard(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(ampp::current_bf16_compute(), expected);
  }
  ampp::set_default_bf16_compute(ampp::Bf16Compute::kFp32);
  {
    ampp::autocast guard(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(ampp::current_bf16_compute(), ampp::Bf16Compute::kFp32);
    ampp::autocast inner(torch::kCPU, torch::kBFloat16, true,
                         ampp::AutocastOptions().bf16_compute(ampp::Bf16Compute::kNative));
    EXPECT_EQ(ampp::current_bf16_compute(), ampp::Bf16Compute::kNative);
  }
  ampp::set_default_bf16_compute(ampp::Bf16Compute::kAutomatic);
  EXPECT_EQ(ampp::default_bf16_compute(), expected);
}

ampp::AutocastOptions fp32_compute() { return ampp::AutocastOptions().bf16_compute(ampp::Bf16Compute::kFp32); }

TEST_F(Bf16Compute, Fp32ComputeStoresBf16Activations) {
  ampp::autocast guard(torch::kCPU, torch::kBFloat16, true, fp32_compute());
  const auto m = torch::randn({4, 5}), v = torch::randn({5, 3}), b3 = torch::randn({2, 4, 5});
  const auto x2 = torch::randn({1, 2, 6, 6}), w2 = torch::randn({3, 2, 3, 3});
  for (const auto& out : {torch::mm(m, v), torch::addmm(torch::randn({3}), m, v), torch::bmm(b3, b3.transpose(1, 2)),
                          torch::baddbmm(torch::randn({4, 4}), b3, b3.transpose(1, 2)), torch::matmul(b3, v),
                          torch::linear(m, v.t()), torch::conv2d(x2, w2), torch::conv2d(x2, w2, {}, 1, "same"),
                          torch::conv1d(torch::randn({2, 8}), torch::randn({3, 2, 3})),
                          torch::addbmm(torch::randn({4, 4}), b3, b3.transpose(1, 2))})
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  // matmul shapes that decompose into mv / dot (not lowered by themselves): bf16, as PyTorch returns.
  const auto v1 = torch::randn({5});
  for (const auto& [out, ref] :
       {std::pair{torch::matmul(m, v1), torch::mv(m, v1)}, std::pair{torch::matmul(v1, v1), torch::dot(v1, v1)},
        std::pair{torch::matmul(b3, v1), torch::matmul(b3.reshape({8, 5}), v1).reshape({2, 4})}}) {
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(out, ref.to(torch::kBFloat16)));  // fp32 arithmetic, one rounding at the output
  }
  // Not a lowered op: a plain convolution call outside conv*d is left alone.
  EXPECT_EQ(at::convolution(x2, w2, {}, {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1).scalar_type(), torch::kFloat);
}

// y = bf16(x_bf16 @ W^T + b) with W, b in fp32; gradients in fp32 from the bf16-stored operands.
TEST_F(Bf16Compute, LinearMatchesFp32ReferenceOnStoredValues) {
  torch::manual_seed(0);
  const auto x = torch::randn({6, 5}).to(torch::kBFloat16).requires_grad_();
  const auto w = torch::randn({3, 5}, torch::requires_grad());
  const auto b = torch::randn({3}, torch::requires_grad());
  const auto g = torch::randn({6, 3}).to(torch::kBFloat16);
  torch::Tensor y;
  {
    ampp::autocast guard(torch::kCPU, torch::kBFloat16, true, fp32_compute());
    y = torch::addmm(b, x, w.t());  // what torch::nn::Linear calls for 2-D input
  }
  y.backward(g);
  // Reference, by hand: everything fp32 from the same stored values.
  const auto x32 = x.detach().to(torch::kFloat), g32 = g.to(torch::kFloat);
  const auto y_ref = torch::mm(x32, w.detach().t()) + b.detach();
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(y, y_ref.to(torch::kBFloat16)));  // one rounding, at the output
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(w.grad(), torch::mm(g32.t(), x32), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(b.grad(), g32.sum(0), 1e-5, 1e-5));
  EXPECT_EQ(x.grad().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(x.grad(), torch::mm(g32, w.detach()).to(torch::kBFloat16)));
}

TEST_F(Bf16Compute, ConvolutionMatchesFp32Reference) {
  torch::manual_seed(1);
  const auto x = torch::randn({2, 3, 7, 7}).to(torch::kBFloat16).requires_grad_();
  const auto w = torch::randn({4, 3, 3, 3}, torch::requires_grad());
  const auto b = torch::randn({4}, torch::requires_grad());
  torch::Tensor y;
  {
    ampp::autocast guard(torch::kCPU, torch::kBFloat16, true, fp32_compute());
    y = torch::conv2d(x, w, b, 2, 1);
  }
  const auto g = torch::randn(y.sizes()).to(torch::kBFloat16);
  y.backward(g);
  const auto x32 = x.detach().to(torch::kFloat).requires_grad_();
  const auto w32 = w.detach().clone().requires_grad_(), b32 = b.detach().clone().requires_grad_();
  const auto y_ref = torch::conv2d(x32, w32, b32, 2, 1);
  y_ref.backward(g.to(torch::kFloat));
  EXPECT_TRUE(torch::equal(y, y_ref.detach().to(torch::kBFloat16)));
  EXPECT_TRUE(torch::allclose(w.grad(), w32.grad(), 1e-5, 1e-4));
  EXPECT_TRUE(torch::allclose(b.grad(), b32.grad(), 1e-5, 1e-4));
  EXPECT_TRUE(torch::equal(x.grad(), x32.grad().to(torch::kBFloat16)));
}

// Under Bf16Compute::kFp32 autograd keeps the operands as stored (bf16 activations, fp32 weights),
// no fp32 copies of the activations.
TEST_F(Bf16Compute, BackwardKeepsOnlyStoredOperands) {
  for (auto mode : {ampp::Bf16Compute::kFp32}) {
    auto x = torch::randn({4, 8}).to(torch::kBFloat16).requires_grad_();
    auto w = torch::randn({8, 8}, torch::requires_grad());
    torch::Tensor y;
    {
      ampp::autocast guard(torch::kCPU, torch::kBFloat16, true, ampp::AutocastOptions().bf16_compute(mode));
      y = torch::mm(x, w);
    }
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    // The only node between y and the leaves is ampp's function: no ToCopyBackward (an upcast recorded
    // by autograd, which would save an fp32 copy) in between.
    const auto& edges = y.grad_fn()->next_edges();
    ASSERT_EQ(edges.size(), 2u);  // a and b (no bias)
    for (const auto& e : edges) EXPECT_EQ(e.function->name(), "torch::autograd::AccumulateGrad");
    y.backward(torch::ones({4, 8}).to(torch::kBFloat16));
    // d(x @ w)/dw with an all-ones gradient: column sums of x, each repeated over the 8 columns.
    const auto expected = x.detach().to(torch::kFloat).sum(0).unsqueeze(1).expand({8, 8});
    EXPECT_TRUE(torch::allclose(w.grad(), expected, 2e-2, 2e-2)) << ampp::to_string(mode);
  }
}

TEST_F(Bf16Compute, TrainsAnMlpLikeFp32) {
  torch::manual_seed(3);
  auto make = [] {
    torch::manual_seed(4);
    return torch::nn::Sequential(torch::nn::Linear(10, 32), torch::nn::ReLU(), torch::nn::Linear(32, 3));
  };
  const auto x = torch::randn({64, 10});
  const auto y = torch::mm(x, torch::randn({10, 3})).argmax(1);  // a learnable (linear) labelling
  auto train = [&](c10::optional<ampp::Bf16Compute> mode) {
    auto net = make();
    torch::optim::SGD opt(net->parameters(), 0.1);
    float loss_value = 0;
    for (int i = 0; i < 30; ++i) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        ampp::autocast guard(torch::kCPU, torch::kBFloat16, mode.has_value(),
                             ampp::AutocastOptions().bf16_compute(mode.value_or(ampp::Bf16Compute::kNative)));
        loss = torch::cross_entropy_loss(net->forward(x), y);
      }
      loss.backward();
      opt.step();
      loss_value = loss.item<float>();
    }
    return loss_value;
  };
  const float fp32 = train(c10::nullopt);
  const float bf16_fp32_compute = train(ampp::Bf16Compute::kFp32);
  const float bf16_native = train(ampp::Bf16Compute::kNative);
  EXPECT_LT(fp32, 0.9f);  // it learns (chance level is ln 3 = 1.10)
  EXPECT_NEAR(bf16_fp32_compute, fp32, 0.05f * fp32);
  EXPECT_NEAR(bf16_native, fp32, 0.1f * fp32);
}

}  // namespace

TEST(Bf16ComputeParser, AcceptsItsSpellingsAndNamesTheSourceOfABadOne) {
  EXPECT_EQ(ampp::parse_bf16_compute("native"), ampp::Bf16Compute::kNative);
  EXPECT_EQ(ampp::parse_bf16_compute("fp32"), ampp::Bf16Compute::kFp32);
  for (const char* automatic : {"auto", "automatic", ""})
    EXPECT_EQ(ampp::parse_bf16_compute(automatic), ampp::Bf16Compute::kAutomatic) << automatic;
  for (const auto c : {ampp::Bf16Compute::kNative, ampp::Bf16Compute::kFp32, ampp::Bf16Compute::kAutomatic})
    EXPECT_EQ(ampp::parse_bf16_compute(ampp::to_string(c)), c);  // to_string's spelling parses back
  AMPP_EXPECT_THROW_WITH(ampp::parse_bf16_compute("fast", "AMPP_BF16_COMPUTE"),
                         "AMPP_BF16_COMPUTE='fast' is not understood; use native, fp32 or auto");
}
