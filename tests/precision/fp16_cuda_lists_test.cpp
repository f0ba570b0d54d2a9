// fp16 emulation on CPU follows CUDA autocast's op lists (Fp16OpLists::kCuda, the default): every op
// CUDA runs in fp16 is emulated in fp16 (inputs and outputs rounded to fp16 values, float32 arithmetic),
// op by op; CUDA's fp32 ops stay float32; Fp16OpLists::kCpu gives the CPU lists back.

#include "precision/test_util.h"

#include <ampp/precision/autocast.h>
#include <ampp/precision/kernels.h>
#include <ampp/precision/rounding.h>
#include <ampp/util/torch_version.h>

#include <functional>
#include <set>

namespace {

using Fp16CudaLists = ampp_test::OneThread;
using Tensors = std::vector<torch::Tensor>;
using ampp::precision::round_to_fp16;

struct LowerOp {
  std::string key;  // the CUDA table's key
  Tensors inputs;   // float32
  std::function<Tensors(const Tensors&)> fn;
};

Tensors one(const torch::Tensor& t) { return {t}; }
Tensors pair(const std::tuple<torch::Tensor, torch::Tensor>& t) { return {std::get<0>(t), std::get<1>(t)}; }
torch::Tensor r(std::vector<int64_t> shape) { return torch::randn(shape); }

// One call per op on the CUDA lower-precision list that runs on CPU (cudnn, _thnn and flash-attention ops do not).
std::vector<LowerOp> lower_ops() {
  torch::manual_seed(7);
  std::vector<LowerOp> ops = {
      {"conv1d",
       {r({1, 2, 8}), r({3, 2, 3}), r({3})},
       [](const Tensors& x) { return one(torch::conv1d(x[0], x[1], x[2])); }},
      {"conv2d",
       {r({1, 2, 6, 6}), r({3, 2, 3, 3}), r({3})},
       [](const Tensors& x) { return one(torch::conv2d(x[0], x[1], x[2])); }},
      {"conv3d",
       {r({1, 2, 4, 4, 4}), r({3, 2, 3, 3, 3})},
       [](const Tensors& x) { return one(torch::conv3d(x[0], x[1])); }},
      {"conv_transpose1d",
       {r({1, 2, 5}), r({2, 3, 3})},
       [](const Tensors& x) { return one(torch::conv_transpose1d(x[0], x[1])); }},
      {"conv_transpose2d.input",
       {r({1, 2, 4, 4}), r({2, 3, 3, 3})},
       [](const Tensors& x) { return one(torch::conv_transpose2d(x[0], x[1])); }},
      {"conv_transpose3d.input",
       {r({1, 2, 3, 3, 3}), r({2, 3, 2, 2, 2})},
       [](const Tensors& x) { return one(torch::conv_transpose3d(x[0], x[1])); }},
      {"convolution",
       {r({1, 2, 6, 6}), r({3, 2, 3, 3})},
       [](const Tensors& x) { return one(at::convolution(x[0], x[1], {}, {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1)); }},
      {"_convolution",
       {r({1, 2, 6, 6}), r({3, 2, 3, 3}), r({3})},
       [](const Tensors& x) {
         return one(
             at::_convolution(x[0], x[1], x[2], {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1, false, false, true, true));
       }},
      {"_convolution.deprecated",
       {r({1, 2, 6, 6}), r({3, 2, 3, 3}), r({3})},
       [](const Tensors& x) {
         return one(at::_convolution(x[0], x[1], x[2], {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1, false, false, true));
       }},
      {"conv_tbc",
       {r({5, 1, 2}), r({3, 2, 4}), r({4})},
       [](const Tensors& x) { return one(at::conv_tbc(x[0], x[1], x[2])); }},
      {"prelu", {r({2, 3, 4}), r({3})}, [](const Tensors& x) { return one(torch::prelu(x[0], x[1])); }},
      {"addmm", {r({3}), r({4, 5}), r({5, 3})}, [](const Tensors& x) { return one(torch::addmm(x[0], x[1], x[2])); }},
      {"addmv", {r({4}), r({4, 5}), r({5})}, [](const Tensors& x) { return one(torch::addmv(x[0], x[1], x[2])); }},
      {"addr", {r({4, 5}), r({4}), r({5})}, [](const Tensors& x) { return one(torch::addr(x[0], x[1], x[2])); }},
      {"matmul", {r({2, 4, 5}), r({5})}, [](const Tensors& x) { return one(torch::matmul(x[0], x[1])); }},
      {"einsum",
       {r({4, 5}), r({5, 3})},
       [](const Tensors& x) { return one(torch::einsum("ij,jk->ik", {x[0], x[1]})); }},
      {"mm", {r({4, 5}), r({5, 3})}, [](const Tensors& x) { return one(torch::mm(x[0], x[1])); }},
      {"mv", {r({4, 5}), r({5})}, [](const Tensors& x) { return one(torch::mv(x[0], x[1])); }},
      {"linear", {r({3, 5}), r({4, 5}), r({4})}, [](const Tensors& x) { return one(torch::linear(x[0], x[1], x[2])); }},
      {"addbmm",
       {r({4, 3}), r({2, 4, 5}), r({2, 5, 3})},
       [](const Tensors& x) { return one(torch::addbmm(x[0], x[1], x[2])); }},
      {"baddbmm",
       {r({2, 4, 3}), r({2, 4, 5}), r({2, 5, 3})},
       [](const Tensors& x) { return one(torch::baddbmm(x[0], x[1], x[2])); }},
      {"bmm", {r({2, 4, 5}), r({2, 5, 3})}, [](const Tensors& x) { return one(torch::bmm(x[0], x[1])); }},
      {"chain_matmul",
       {r({3, 4}), r({4, 5}), r({5, 2})},
       [](const Tensors& x) { return one(torch::chain_matmul({x[0], x[1], x[2]})); }},
      {"linalg_multi_dot",
       {r({3, 4}), r({4, 5}), r({5, 2})},
       [](const Tensors& x) { return one(torch::linalg_multi_dot({x[0], x[1], x[2]})); }},
      {"lstm_cell",
       {r({2, 3}), r({2, 4}), r({2, 4}), r({16, 3}), r({16, 4})},
       [](const Tensors& x) { return pair(torch::lstm_cell(x[0], {x[1], x[2]}, x[3], x[4])); }},
      {"gru_cell",
       {r({2, 3}), r({2, 4}), r({12, 3}), r({12, 4})},
       [](const Tensors& x) { return one(torch::gru_cell(x[0], x[1], x[2], x[3])); }},
      {"rnn_tanh_cell",
       {r({2, 3}), r({2, 4}), r({4, 3}), r({4, 4})},
       [](const Tensors& x) { return one(torch::rnn_tanh_cell(x[0], x[1], x[2], x[3])); }},
      {"rnn_relu_cell",
       {r({2, 3}), r({2, 4}), r({4, 3}), r({4, 4})},
       [](const Tensors& x) { return one(torch::rnn_relu_cell(x[0], x[1], x[2], x[3])); }},
  };
#if AMPP_TORCH_AT_LEAST(2, 0)
  ops.push_back(
      {"linalg_vecdot", {r({3, 5}), r({3, 5})}, [](const Tensors& x) { return one(at::linalg_vecdot(x[0], x[1])); }});
  ops.push_back({"scaled_dot_product_attention",
                 {r({1, 2, 4, 8}), r({1, 2, 4, 8}), r({1, 2, 4, 8})},
                 [](const Tensors& x) { return one(at::scaled_dot_product_attention(x[0], x[1], x[2])); }});
#endif
  return ops;
}

bool all_fp16_values(const torch::Tensor& t) { return torch::equal(round_to_fp16(t), t); }

// Each op in the region equals, bit for bit, the op outside it on fp16-rounded inputs with its output
// rounded to fp16 (what a GPU computes, but with float32 accumulation: docs/precision.md).
TEST_F(Fp16CudaLists, EveryCudaFp16OpIsEmulatedInFp16) {
  std::set<std::string> tested;
  for (const auto& op : lower_ops()) {
    SCOPED_TRACE(op.key);
    ASSERT_EQ(ampp::policy_of(op.key, torch::kCUDA), ampp::CastPolicy::kLowerPrecision);
    Tensors rounded;
    for (const auto& t : op.inputs) rounded.push_back(round_to_fp16(t));
    Tensors want = op.fn(rounded);
    Tensors got;
    {
      ampp::autocast guard(torch::kCPU, torch::kHalf);
      got = op.fn(op.inputs);
    }
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].scalar_type(), torch::kFloat);
      EXPECT_TRUE(all_fp16_values(got[i])) << "output " << i << " is not rounded to fp16";
      EXPECT_TRUE(torch::equal(got[i], round_to_fp16(want[i]))) << "output " << i;
    }
    tested.insert(op.key);
  }
  // Every CUDA lower-precision op this LibTorch has is covered, except those with no CPU kernel, which a GPU reaches
  // only from a listed op tested here (conv2d, lstm_cell, scaled_dot_product_attention), and _cudnn_rnn (a CUDA
  // LibTorch's), which the CPU never reaches: it is emulated at lstm/gru/rnn_tanh/rnn_relu (fp16_rnn_test.cpp).
  const std::set<std::string> no_cpu_kernel{"cudnn_convolution", "cudnn_convolution_transpose", "_thnn_fused_lstm_cell",
                                            "_thnn_fused_gru_cell", "_scaled_dot_product_flash_attention"};
  const std::set<std::string> emulated_as_composite_rnns{"_cudnn_rnn"};
  for (const auto& key : ampp::ops_with_policy(ampp::CastPolicy::kLowerPrecision, torch::kCUDA))
    EXPECT_TRUE(tested.count(key) || no_cpu_kernel.count(key) || emulated_as_composite_rnns.count(key))
        << key << " has no test here";
}

TEST_F(Fp16CudaLists, CudaFp32OpsStayFloat32AndCpuListsAreSelectable) {
  const auto x = torch::randn({4, 5}), v = torch::randn({5});
  ampp::autocast guard(torch::kCPU, torch::kHalf);
  // CUDA runs these in fp32: nothing is rounded.
  EXPECT_FALSE(all_fp16_values(torch::exp(x)));
  EXPECT_TRUE(torch::equal(torch::softmax(x, 1), [&] {
    ampp::autocast off(torch::kCPU, torch::kHalf, false);
    return torch::softmax(x, 1);
  }()));
  EXPECT_TRUE(all_fp16_values(torch::mv(x, v)));
  {
    ampp::autocast cpu_lists(torch::kCPU, torch::kHalf, true,
                             ampp::AutocastOptions().fp16_op_lists(ampp::Fp16OpLists::kCpu));
    EXPECT_FALSE(all_fp16_values(torch::mv(x, v)));  // not on the CPU lists: float32
    EXPECT_TRUE(all_fp16_values(torch::mm(x, x.t())));
  }
  EXPECT_TRUE(all_fp16_values(torch::mv(x, v)));  // the enclosing region's lists again
}

// Ops only the CUDA lists name get ampp's kernel at the first fp16 region; bf16 regions then pass them through as
// LibTorch's fallthrough does, so a composite op's inner GEMMs still run in bf16 (einsum's bmm here).
TEST_F(Fp16CudaLists, CudaListKernelsPassBf16RegionsThrough) {
  const auto a = torch::randn({2, 4, 5}), b = torch::randn({2, 5, 3});
  auto einsum_bf16 = [&] {
    ampp::autocast guard(torch::kCPU, torch::kBFloat16);
    return torch::einsum("bij,bjk->bik", {a, b});
  };
  ampp::precision::uninstall_autocast_kernels();  // the next region installs the CPU lists' kernels only
  const auto before = einsum_bf16();
  {  // an fp16 region installs the CUDA lists' kernels, einsum's included
    ampp::autocast fp16(torch::kCPU, torch::kHalf);
  }
  const auto after = einsum_bf16();
  EXPECT_EQ(before.scalar_type(), torch::kBFloat16);  // as PyTorch's CPU autocast
  EXPECT_EQ(after.scalar_type(), before.scalar_type());
  EXPECT_TRUE(torch::equal(after, before));
}

// A user's CPU registration also holds in fp16 regions that follow the CUDA lists.
TEST_F(Fp16CudaLists, UserRegistrationsOverrideTheCudaLists) {
  const auto x = torch::randn({4, 5}), v = torch::randn({5});
  ampp::register_float_function("mv");
  {
    ampp::autocast guard(torch::kCPU, torch::kHalf);
    EXPECT_FALSE(all_fp16_values(torch::mv(x, v)));
  }
  ampp::reset_op_policies(torch::kCPU);
  ampp::autocast guard(torch::kCPU, torch::kHalf);
  EXPECT_TRUE(all_fp16_values(torch::mv(x, v)));
}

// The CUDA table is the CUDA list of the LibTorch built against: the same ops LibTorch registers on
// AutocastCUDA (a CPU build registers them too).
TEST_F(Fp16CudaLists, CudaTableCoversExactlyLibTorchsCudaList) {
  std::set<std::string> ampp_ops, libtorch;
  for (auto policy : {ampp::CastPolicy::kLowerPrecision, ampp::CastPolicy::kFp32, ampp::CastPolicy::kFp32SetOptDtype,
                      ampp::CastPolicy::kFp32AppendDtype, ampp::CastPolicy::kPromote, ampp::CastPolicy::kBanned})
    for (const auto& key : ampp::ops_with_policy(policy, torch::kCUDA)) ampp_ops.insert(key);
  for (const auto& name : c10::Dispatcher::singleton().getRegistrationsForDispatchKey(c10::DispatchKey::AutocastCUDA)) {
    std::string key = name.name.substr(std::string("aten::").size());
    if (!name.overload_name.empty()) key += "." + name.overload_name;
    libtorch.insert(key);
  }
  EXPECT_GT(libtorch.size(), 80u);
  EXPECT_TRUE(ampp_test::same_ops(ampp_ops, libtorch));
}

}  // namespace
