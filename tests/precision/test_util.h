#pragma once
// Helpers shared by the precision tests.

#include <ATen/ATen.h>
#include <ampp/precision/torch_compat.h>
#include <torch/torch.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ampp_test {

// The precision tests check dtypes and exact values; one thread keeps reductions deterministic.
struct OneThread : ::testing::Test {
  void SetUp() override { at::set_num_threads(1); }
  void TearDown() override {
    // Every test must leave the thread without an active region.
    EXPECT_FALSE(ampp::precision::compat::autocast_enabled(c10::DeviceType::CPU));
  }
};

// The autograd node that produced the weight operand of `y` (an mm/addmm output): identical nodes
// mean the weight cast came from the cache.
// Under fp16 emulation the op's own node sits below the two casts that round its output.
inline torch::autograd::Node* weight_cast_node(const torch::Tensor& y, size_t edge) {
  torch::autograd::Node* node = y.grad_fn().get();
  while (node->name().find("ToCopyBackward") != std::string::npos) node = node->next_edges().at(0).function.get();
  return node->next_edges().at(edge).function.get();
}

}  // namespace ampp_test
