#pragma once
// Helpers shared by the precision tests.

#include <ATen/ATen.h>
#include <ampp/precision/autocast.h>
#include <ampp/precision/torch_compat.h>
#include <torch/torch.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace ampp_test {

// The precision tests check dtypes and exact values; one thread keeps reductions deterministic.
struct OneThread : ::testing::Test {
  void SetUp() override { at::set_num_threads(1); }
  void TearDown() override {
    // Every test must leave the thread without an active region.
    EXPECT_FALSE(ampp::precision::compat::autocast_enabled(c10::DeviceType::CPU));
  }
};

// LibTorch's bf16 kernels for CPU bf16 regions while alive (Bf16Compute::kNative, what PyTorch's autocast
// runs), whatever this CPU's bf16 units: on a CPU without them ampp computes bf16 GEMMs in fp32 by default,
// with no cast copies of weights and another rounding. For comparisons with PyTorch and checks of the native
// path.
struct NativeBf16 {
  NativeBf16() { ampp::set_default_bf16_compute(ampp::Bf16Compute::kNative); }
  ~NativeBf16() { ampp::set_default_bf16_compute(ampp::Bf16Compute::kAutomatic); }
  NativeBf16(const NativeBf16&) = delete;
  NativeBf16& operator=(const NativeBf16&) = delete;
};

// The autograd node that produced the weight operand of `y` (an mm/addmm output): identical nodes
// mean the weight cast came from the cache.
// Under fp16 emulation the op's own node sits below the two casts that round its output.
inline torch::autograd::Node* weight_cast_node(const torch::Tensor& y, size_t edge) {
  torch::autograd::Node* node = y.grad_fn().get();
  while (node->name().find("ToCopyBackward") != std::string::npos) node = node->next_edges().at(0).function.get();
  return node->next_edges().at(edge).function.get();
}

// Two op sets equal, or a failure that lists what only each side has (the sets are 100+ names long).
inline ::testing::AssertionResult same_ops(const std::set<std::string>& ampp, const std::set<std::string>& libtorch) {
  std::string only_ampp, only_libtorch;
  for (const auto& op : ampp)
    if (!libtorch.count(op)) only_ampp += " " + op;
  for (const auto& op : libtorch)
    if (!ampp.count(op)) only_libtorch += " " + op;
  if (only_ampp.empty() && only_libtorch.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "only in ampp's table:" << only_ampp
                                       << "; only in LibTorch's list:" << only_libtorch;
}

}  // namespace ampp_test
