// The RAII region: state save/restore, nesting, exceptions, disabled sections, cache lifetime, and
// the errors for unsupported devices/dtypes.

#include "precision/test_util.h"

#include <ampp/precision/autocast.h>

#include <stdexcept>

namespace {

using ampp_test::OneThread;
using AutocastGuard = OneThread;

TEST_F(AutocastGuard, EnablesAndRestoresState) {
  EXPECT_FALSE(ampp::is_autocast_enabled(torch::kCPU));
  {
    ampp::autocast guard(torch::kCPU, torch::kBFloat16);
    EXPECT_TRUE(ampp::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(ampp::autocast_dtype(torch::kCPU), torch::kBFloat16);
    EXPECT_FALSE(ampp::is_fp16_emulated());
    auto y = torch::mm(torch::ones({2, 3}), torch::ones({3, 4}));
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(ampp::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(torch::mm(torch::ones({2, 3}), torch::ones({3, 4})).scalar_type(), torch::kFloat);
}

TEST_F(AutocastGuard, NestsAndRestoresEachLevel) {
  const auto a = torch::ones({2, 2});
  ampp::autocast outer(torch::kCPU, torch::kBFloat16);
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  {
    ampp::autocast inner(torch::kCPU, torch::kHalf);
    EXPECT_TRUE(ampp::is_fp16_emulated());
    EXPECT_EQ(ampp::autocast_dtype(), torch::kHalf);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);  // fp16 values in an fp32 carrier
    {
      ampp::autocast off(torch::kCPU, torch::kHalf, /*enabled=*/false);  // custom fp32 section
      EXPECT_FALSE(ampp::is_autocast_enabled());
      EXPECT_FALSE(ampp::is_fp16_emulated());
      EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
    }
    EXPECT_TRUE(ampp::is_fp16_emulated());
  }
  EXPECT_FALSE(ampp::is_fp16_emulated());
  EXPECT_EQ(ampp::autocast_dtype(), torch::kBFloat16);
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
}

TEST_F(AutocastGuard, DisabledInnerRegionRunsFp32AndReenables) {
  const auto a = torch::ones({2, 2});
  ampp::autocast outer(torch::kCPU, torch::kBFloat16);
  auto low = torch::mm(a, a);
  {
    ampp::autocast fp32_section(torch::kCPU, torch::kBFloat16, false);
    // Tensors produced in bf16 outside must be cast by hand inside, as in PyTorch.
    auto y = torch::mm(low.to(torch::kFloat), a);
    EXPECT_EQ(y.scalar_type(), torch::kFloat);
    EXPECT_THROW(torch::mm(low, a), c10::Error);  // mixed bf16/fp32 without autocast
  }
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
}

TEST_F(AutocastGuard, ExceptionUnwindingRestoresEveryLevel) {
  const int nesting_before = at::autocast::increment_nesting() - 1;
  at::autocast::decrement_nesting();
  try {
    ampp::autocast outer(torch::kCPU, torch::kBFloat16);
    ampp::autocast inner(torch::kCPU, torch::kHalf);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(ampp::is_autocast_enabled());
  EXPECT_FALSE(ampp::is_fp16_emulated());
  EXPECT_EQ(ampp::precision::compat::autocast_dtype(c10::DeviceType::CPU), torch::kBFloat16);
  EXPECT_EQ(at::autocast::increment_nesting(), nesting_before + 1);
  at::autocast::decrement_nesting();
  // An error raised by an op inside the region unwinds the same way.
  try {
    ampp::autocast guard(torch::kCPU, torch::kBFloat16);
    torch::mm(torch::ones({2, 3}), torch::ones({2, 3}));  // shape mismatch
    FAIL() << "mm with mismatched shapes must throw";
  } catch (const c10::Error&) {
  }
  EXPECT_FALSE(ampp::is_autocast_enabled());
}

TEST_F(AutocastGuard, ConstructorErrorLeavesStateUntouched) {
  ampp::autocast outer(torch::kCPU, torch::kBFloat16);
  EXPECT_THROW(ampp::autocast bad(torch::kCPU, torch::kFloat), c10::Error);
  EXPECT_TRUE(ampp::is_autocast_enabled());
  EXPECT_EQ(ampp::autocast_dtype(), torch::kBFloat16);
}

// Casts of fp32 leaves (weights) are cached within a region: the same autograd node feeds every use.
// fp16 emulation caches its rounded weights, native bf16 uses LibTorch's cache (observed through
// addbmm here; Bf16Compute::kFp32 keeps no cast copies of weights at all).
TEST_F(AutocastGuard, WeightCastCachedWithinRegionAndClearedAtOutermostExit) {
  const ampp_test::NativeBf16 native;  // the cache of bf16 casts is the native path's
  auto w = torch::randn({2, 4, 3}, torch::requires_grad());
  auto x = torch::randn({2, 3, 4});
  auto bias = torch::zeros({4, 4});
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    auto use = [&] { return torch::addbmm(bias, w, x); };
    torch::Tensor z1;  // kept alive so that its nodes' addresses cannot be reused
    torch::autograd::Node* first = nullptr;
    {
      ampp::autocast guard(torch::kCPU, dtype);
      z1 = use();
      {
        ampp::autocast nested(torch::kCPU, dtype);  // an inner exit must not clear the cache
      }
      auto z2 = use();
      first = ampp_test::weight_cast_node(z1, 1);
      EXPECT_EQ(first, ampp_test::weight_cast_node(z2, 1)) << c10::toString(dtype);
      EXPECT_NE(first->name(), "torch::autograd::AccumulateGrad");
      // A view of the weight is not cached (as in LibTorch).
      auto v1 = torch::addbmm(bias, w.transpose(1, 2).transpose(1, 2), x);
      auto v2 = torch::addbmm(bias, w.transpose(1, 2).transpose(1, 2), x);
      EXPECT_NE(ampp_test::weight_cast_node(v1, 1), ampp_test::weight_cast_node(v2, 1));
    }
    ampp::autocast again(torch::kCPU, dtype);
    auto z3 = use();
    EXPECT_NE(first, ampp_test::weight_cast_node(z3, 1)) << "cache must be cleared at outermost exit";
  }
}

TEST_F(AutocastGuard, CacheCanBeDisabled) {
  auto w = torch::randn({4, 3}, torch::requires_grad());
  auto x = torch::randn({2, 3});
  ampp::autocast guard(torch::kCPU, torch::kHalf, true, ampp::AutocastOptions().cache_enabled(false));
  auto z1 = torch::mm(w, x.t());
  auto z2 = torch::mm(w, x.t());
  EXPECT_NE(ampp_test::weight_cast_node(z1, 0)->name(), "torch::autograd::AccumulateGrad");
  EXPECT_NE(ampp_test::weight_cast_node(z1, 0), ampp_test::weight_cast_node(z2, 0));
}

TEST_F(AutocastGuard, UnsupportedDevicesAndDtypesAreClearErrors) {
  // This LibTorch has no CUDA: fp16 on CUDA cannot run anywhere here.
  try {
    ampp::autocast guard(torch::kCUDA, torch::kHalf);
    if (!torch::cuda::is_available()) FAIL() << "expected an error without CUDA";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("CUDA"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("torch::kCPU"));
  }
  try {
    ampp::autocast guard(c10::DeviceType::MPS, torch::kHalf);
    FAIL() << "expected an error for MPS";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("has no autocast support"));
  }
  try {
    ampp::autocast guard(torch::kCPU, torch::kDouble);
    FAIL() << "expected an error for double";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("kBFloat16 or torch::kHalf"));
  }
  EXPECT_FALSE(ampp::is_autocast_enabled());
  // Disabling CUDA autocast where there is none is harmless.
  EXPECT_NO_THROW(ampp::autocast off(torch::kCUDA, torch::kHalf, false));
}

TEST_F(AutocastGuard, StateIsThreadLocal) {
  ampp::autocast guard(torch::kCPU, torch::kHalf);
  bool other_enabled = true;
  std::thread([&] { other_enabled = ampp::is_autocast_enabled() || ampp::is_fp16_emulated(); }).join();
  EXPECT_FALSE(other_enabled);
}

TEST_F(AutocastGuard, LibTorchFlagAloneBehavesLikeLibTorch) {
  // A user who enables LibTorch's CPU autocast directly (no ampp region) gets bf16 as before.
  {
    ampp::autocast warm(torch::kCPU, torch::kBFloat16);  // makes sure ampp's kernels are installed
  }
  ampp::precision::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
  auto y = torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  ampp::precision::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
}

}  // namespace
