// The op lists: every listed op exists, runs in its documented dtype under the guard, and the lists
// can be queried and changed at run time.

#include <ampp/util/torch_version.h>
#include "ampp/precision/detail.h"
#include "precision/test_util.h"

#include <ampp/precision/autocast.h>
#include <ampp/precision/kernels.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <set>

namespace {

using ampp::CastPolicy;
using OpPolicy = ampp_test::OneThread;

const auto kF32 = torch::kFloat;
const auto kBF16 = torch::kBFloat16;

torch::Tensor bf(torch::IntArrayRef sizes) { return torch::randn(sizes).to(kBF16); }

#if !AMPP_TORCH_AT_LEAST(2, 0)
TEST_F(OpPolicy, DefaultListsArePyTorch113Cpu) {
  EXPECT_EQ(ampp::ops_with_policy(CastPolicy::kLowerPrecision).size(), 15u);
  // 126 AutocastCPU registrations in PyTorch 1.13.1: 15 lower + 4 promote + 107 fp32 (incl. BCE); of
  // the promote ops, cat behaves as ordinary type promotion in 1.13 and has no policy (torch_compat.h).
  EXPECT_EQ(ampp::ops_with_policy(CastPolicy::kPromote).size(), 3u);
  EXPECT_EQ(ampp::ops_with_policy(CastPolicy::kFp32).size() + ampp::ops_with_policy(CastPolicy::kBanned).size(), 107u);
  EXPECT_EQ(ampp::policy_of("addmm"), CastPolicy::kLowerPrecision);
  EXPECT_EQ(ampp::policy_of("aten::conv2d.padding"), CastPolicy::kLowerPrecision);
  EXPECT_EQ(ampp::policy_of("softmax"), CastPolicy::kNone);  // not on PyTorch 1.13's CPU lists
  EXPECT_EQ(ampp::policy_of("softmax.int", torch::kCUDA), CastPolicy::kFp32SetOptDtype);
  EXPECT_EQ(ampp::policy_of("mse_loss"), CastPolicy::kFp32);
  EXPECT_EQ(ampp::policy_of("stack"), CastPolicy::kPromote);
  EXPECT_EQ(ampp::policy_of("binary_cross_entropy"), CastPolicy::kBanned);
  EXPECT_EQ(ampp::policy_of("norm.Scalar", torch::kCUDA), CastPolicy::kFp32AppendDtype);
  EXPECT_STREQ(ampp::to_string(ampp::policy_of("prod")), "fp32");
  EXPECT_THROW(ampp::policy_of("mm", c10::DeviceType::MPS), c10::Error);
}
#endif

TEST_F(OpPolicy, EveryListedOpIsARegisteredAtenOp) {
  for (auto device : {torch::kCPU, torch::kCUDA}) {
    for (auto policy : {CastPolicy::kLowerPrecision, CastPolicy::kFp32, CastPolicy::kFp32SetOptDtype,
                        CastPolicy::kFp32AppendDtype, CastPolicy::kPromote, CastPolicy::kBanned}) {
      for (const auto& key : ampp::ops_with_policy(policy, device)) {
        const auto dot = key.find('.');
        const std::string overload = dot == std::string::npos ? "" : key.substr(dot + 1);
        EXPECT_TRUE(c10::Dispatcher::singleton().findSchema({"aten::" + key.substr(0, dot), overload}).has_value())
            << key;
      }
    }
  }
}

// The default CPU table autocasts exactly the ops LibTorch's own CPU autocast does (1.13's list,
// or 2.x's with its additions and removals).
TEST_F(OpPolicy, DefaultCpuTableCoversExactlyLibTorchsCpuList) {
  ampp::reset_op_policies(torch::kCPU);
  std::set<std::string> ampp_ops;
  for (auto policy : {CastPolicy::kLowerPrecision, CastPolicy::kFp32, CastPolicy::kPromote, CastPolicy::kBanned})
    for (const auto& key : ampp::ops_with_policy(policy, torch::kCPU)) ampp_ops.insert(key);
#if !AMPP_TORCH_AT_LEAST(2, 0)
  // 1.13 registers cat, but its cat behaves as ordinary type promotion: no policy in ampp (torch_compat.h).
  EXPECT_EQ(ampp::policy_of("cat"), CastPolicy::kNone);
  ampp_ops.insert("cat");
#endif
  const auto& libtorch = ampp::precision::detail::libtorch_cpu_autocast_ops();
  EXPECT_GT(libtorch.size(), 100u);
  EXPECT_TRUE(ampp_test::same_ops(ampp_ops, libtorch));
#if AMPP_TORCH_AT_LEAST(2, 0)
  EXPECT_EQ(ampp::policy_of("conv_transpose2d.input"), CastPolicy::kLowerPrecision);
  EXPECT_EQ(ampp::policy_of("scaled_dot_product_attention"), CastPolicy::kLowerPrecision);
#else
  EXPECT_EQ(ampp::policy_of("conv_transpose2d.input"), CastPolicy::kFp32);
#endif
}

// Every op on the CPU lower-precision list, called the way a model calls it.
TEST_F(OpPolicy, LowerPrecisionOpsRunInBf16) {
  ampp::autocast guard(torch::kCPU, kBF16, true, ampp::AutocastOptions().bf16_compute(ampp::Bf16Compute::kNative));
  const auto m = torch::randn({4, 5}), v = torch::randn({5, 3}), b3 = torch::randn({2, 4, 5});
  const auto c3 = torch::randn({2, 5, 3});
  const auto x1 = torch::randn({1, 2, 8}), w1 = torch::randn({3, 2, 3});
  const auto x2 = torch::randn({1, 2, 6, 6}), w2 = torch::randn({3, 2, 3, 3});
  const auto x3 = torch::randn({1, 2, 4, 4, 4}), w3 = torch::randn({3, 2, 3, 3, 3});
  std::vector<std::pair<std::string, torch::Tensor>> outs = {
      {"mm", torch::mm(m, v)},
      {"addmm", torch::addmm(torch::randn({3}), m, v)},
      {"bmm", torch::bmm(b3, c3)},
      {"baddbmm", torch::baddbmm(torch::randn({2, 4, 3}), b3, c3)},
      {"addbmm", torch::addbmm(torch::randn({4, 3}), b3, c3)},
      {"matmul", torch::matmul(b3, v)},
      {"linear", torch::linear(m, v.t(), torch::randn({3}))},
      {"conv1d", torch::conv1d(x1, w1)},
      {"conv1d.padding", torch::conv1d(x1, w1, {}, 1, "same")},
      {"conv2d", torch::conv2d(x2, w2)},
      {"conv2d.padding", torch::conv2d(x2, w2, {}, 1, "same")},
      {"conv3d", torch::conv3d(x3, w3)},
      {"conv3d.padding", torch::conv3d(x3, w3, {}, 1, "valid")},
      {"_convolution.deprecated",
       at::_convolution(x2, w2, {}, {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1, false, false, true)},
      {"conv_tbc", at::conv_tbc(torch::randn({5, 1, 2}), torch::randn({3, 2, 4}), torch::randn({4}))},
  };
  size_t not_called = 0;
#if AMPP_TORCH_AT_LEAST(2, 0)
  const auto q = torch::randn({1, 2, 4, 8});
  const std::vector<std::pair<std::string, torch::Tensor>> added_in_2x = {
      {"conv_transpose1d", torch::conv_transpose1d(x1, w1.transpose(0, 1))},
      {"conv_transpose2d.input", torch::conv_transpose2d(x2, w2.transpose(0, 1))},
      {"conv_transpose3d.input", torch::conv_transpose3d(x3, w3.transpose(0, 1))},
      {"prelu", torch::prelu(m, torch::full({1}, 0.25))},
      {"scaled_dot_product_attention", at::scaled_dot_product_attention(q, q, q)},
      {"linalg_vecdot", torch::linalg_vecdot(m, m)},
      {"_addmm_activation", at::_addmm_activation(torch::randn({3}), m, v)},
  };
  outs.insert(outs.end(), added_in_2x.begin(), added_in_2x.end());
  // Internal ops a model does not call directly (oneDNN's RNN layer, fused multi-head attention).
  for (const char* op : {"mkldnn_rnn_layer", "_native_multi_head_attention"})
    not_called += ampp::policy_of(op) == CastPolicy::kLowerPrecision;
#endif
  EXPECT_EQ(outs.size() + not_called, ampp::ops_with_policy(CastPolicy::kLowerPrecision).size());
  for (const auto& [name, out] : outs) {
    EXPECT_EQ(ampp::policy_of(name), CastPolicy::kLowerPrecision) << name;
    EXPECT_EQ(out.scalar_type(), kBF16) << name;
  }
}

TEST_F(OpPolicy, Fp32OpsRunInFp32) {
  ampp::autocast guard(torch::kCPU, kBF16);
  const auto p = bf({4, 3}), t = bf({4, 3}), sq = bf({3, 3}) + torch::eye(3).to(kBF16) * 4;
  std::vector<std::pair<std::string, torch::Tensor>> outs = {
      {"mse_loss", torch::mse_loss(p, t)},
      {"l1_loss", torch::l1_loss(p, t)},
      {"smooth_l1_loss", torch::smooth_l1_loss(p, t)},
      {"huber_loss", torch::huber_loss(p, t)},
      {"kl_div", torch::kl_div(p, t)},
      {"nll_loss", torch::nll_loss(p, torch::tensor({0, 1, 2, 0}))},
      {"cross_entropy_loss", torch::cross_entropy_loss(p, torch::tensor({0, 1, 2, 0}))},
      {"binary_cross_entropy_with_logits", torch::binary_cross_entropy_with_logits(p, torch::rand({4, 3}))},
      {"prod", torch::prod(p)},
      {"prod.dim_int", torch::prod(p, 1)},
      {"cdist", torch::cdist(p, t)},
      {"trace", torch::trace(sq)},
      {"linalg_inv", torch::linalg_inv(sq)},
#if !AMPP_TORCH_AT_LEAST(2, 0)  // lower precision in 2.x
      {"conv_transpose2d.input", torch::conv_transpose2d(bf({1, 2, 4, 4}), bf({2, 3, 3, 3}))},
#endif
      {"max_pool3d", torch::max_pool3d(bf({1, 1, 4, 4, 4}), 2)},
      {"fft_rfft", torch::fft::rfft(bf({8}))},
  };
  for (const auto& [name, out] : outs) {
    EXPECT_EQ(ampp::policy_of(name), CastPolicy::kFp32) << name;
    EXPECT_TRUE(out.scalar_type() == kF32 || out.scalar_type() == torch::kComplexFloat)
        << name << " -> " << out.scalar_type();
  }
}

TEST_F(OpPolicy, PromoteOpsTakeTheWidestType) {
  ampp::autocast guard(torch::kCPU, kBF16);
  EXPECT_EQ(torch::cat({torch::ones({2}), bf({2})}).scalar_type(), kF32);
  EXPECT_EQ(torch::cat({bf({2}), bf({2})}).scalar_type(), kBF16);
  EXPECT_EQ(torch::stack({bf({2}), torch::ones({2})}).scalar_type(), kF32);
  EXPECT_EQ(torch::index_copy(bf({3}), 0, torch::tensor({1}), torch::ones({1})).scalar_type(), kF32);
  // fp64 arguments are ignored when choosing the type, as in PyTorch.
  EXPECT_EQ(torch::cat({bf({2}), torch::ones({2}, torch::kDouble)}).scalar_type(), torch::kDouble);
}

TEST_F(OpPolicy, UnlistedOpsKeepTheirInputDtype) {
  ampp::autocast guard(torch::kCPU, kBF16);
  EXPECT_EQ(torch::softmax(bf({2, 3}), 1).scalar_type(), kBF16);
  EXPECT_EQ(torch::softmax(torch::ones({2, 3}), 1).scalar_type(), kF32);
  EXPECT_EQ(torch::relu(torch::ones({2})).scalar_type(), kF32);
  // fp64 and integer tensors are never cast.
  EXPECT_EQ(torch::mm(torch::ones({2, 2}, torch::kDouble), torch::ones({2, 2}, torch::kDouble)).scalar_type(),
            torch::kDouble);
}

TEST_F(OpPolicy, BinaryCrossEntropyIsBannedInFp16) {
  const auto p = torch::full({4}, 0.5), t = torch::ones({4});
  {
    ampp::autocast guard(torch::kCPU, torch::kHalf);
    try {
      torch::binary_cross_entropy(p, t);
      FAIL() << "binary_cross_entropy must raise under fp16 autocast";
    } catch (const c10::Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("unsafe to autocast"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("binary_cross_entropy_with_logits"));
    }
    // The safe form works.
    EXPECT_EQ(torch::binary_cross_entropy_with_logits(p, t).scalar_type(), kF32);
  }
  {
    ampp::autocast guard(torch::kCPU, torch::kHalf, true, ampp::AutocastOptions().allow_banned(true));
    EXPECT_NEAR(torch::binary_cross_entropy(p, t).item<float>(), std::log(2.0f), 1e-6);
  }
  {
    ampp::autocast guard(torch::kCPU, kBF16);  // PyTorch's CPU autocast: fp32
    auto loss = torch::binary_cross_entropy(p.to(kBF16), t.to(kBF16));
    EXPECT_EQ(loss.scalar_type(), kF32);
    EXPECT_NEAR(loss.item<float>(), std::log(2.0f), 1e-6);
  }
}

struct OpRegistration : OpPolicy {
  void TearDown() override {
    ampp::reset_op_policies();
    OpPolicy::TearDown();
  }
};

TEST_F(OpRegistration, HalfFloatAndPromoteRegistrationsTakeEffect) {
  const auto m = torch::randn({3, 4}), v = torch::randn({4});
  {
    ampp::autocast guard(torch::kCPU, kBF16);
    EXPECT_EQ(torch::mv(m, v).scalar_type(), kF32);  // mv is not on the CPU list
    EXPECT_THROW(torch::dot(v, v.to(kBF16)), c10::Error);
  }
  ampp::register_half_function("mv");
  ampp::register_float_function("aten::mm");
  ampp::register_promote_function("dot");
  EXPECT_EQ(ampp::policy_of("mv"), CastPolicy::kLowerPrecision);
  EXPECT_EQ(ampp::policy_of("mm"), CastPolicy::kFp32);
  {
    ampp::autocast guard(torch::kCPU, kBF16);
    EXPECT_EQ(torch::mv(m, v).scalar_type(), kBF16);
    EXPECT_EQ(torch::mm(m.to(kBF16), m.t().to(kBF16)).scalar_type(), kF32);
    auto d = torch::dot(v, v.to(kBF16));
    EXPECT_EQ(d.scalar_type(), kF32);
  }
  {
    ampp::autocast guard(torch::kCPU, torch::kHalf);  // fp16 emulation honours registrations too
    auto y = torch::mv(torch::full({1, 2}, 1.0), torch::tensor({0.125f, 0.00006103515625f /*2^-14*/}));
    EXPECT_EQ(y.item<float>(), 0.125f);
  }
  ampp::register_op_policy("mv", CastPolicy::kNone);
  {
    ampp::autocast guard(torch::kCPU, kBF16);
    EXPECT_EQ(torch::mv(m, v).scalar_type(), kF32);
  }
}

TEST_F(OpRegistration, RegistrationBeforeKernelsAreInstalledTakesEffect) {
  ampp::precision::uninstall_autocast_kernels();
  EXPECT_FALSE(ampp::precision::autocast_kernels_installed());
  ampp::register_half_function("mv");
  ampp::autocast guard(torch::kCPU, kBF16);
  EXPECT_TRUE(ampp::precision::autocast_kernels_installed());
  EXPECT_EQ(torch::mv(torch::randn({3, 4}), torch::randn({4})).scalar_type(), kBF16);
}

TEST_F(OpRegistration, BadRegistrationsAreClearErrors) {
  try {
    ampp::register_half_function("no_such_op");
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("no op named 'aten::no_such_op'"));
  }
  try {
    ampp::register_float_function("add_.Tensor");
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("out-of-place"));
  }
  EXPECT_THROW(ampp::register_op_policy("mm", CastPolicy::kFp32SetOptDtype), c10::Error);
  EXPECT_THROW(ampp::register_half_function("mm", torch::kCUDA), c10::Error);  // no CUDA build
  EXPECT_EQ(ampp::policy_of("mm"), CastPolicy::kLowerPrecision);               // unchanged by failed calls
}

TEST_F(OpRegistration, UninstallRestoresLibTorchKernels) {
  ampp::precision::uninstall_autocast_kernels();
  // LibTorch's own CPU autocast refuses fp16; with ampp's kernels removed, bf16 still works.
  ampp::precision::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
  auto y = torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  ampp::precision::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(y.scalar_type(), kBF16);
  ampp::precision::install_autocast_kernels();
  EXPECT_TRUE(ampp::precision::autocast_kernels_installed());
}

}  // namespace
