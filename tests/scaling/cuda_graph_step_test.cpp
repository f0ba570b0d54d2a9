// ampp::CudaGraphStep where it cannot capture: a CPU-only LibTorch, or a CUDA one without a GPU, each
// refused with a one-line cause and fix. Its capture and replay run in the GPU suite
// (tests/gpu/cuda_graph_test.cpp).
#include <ampp/scaling/cuda_graph_step.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "ampp_test.h"

using ::testing::HasSubstr;

TEST(CudaGraphStep, KnowsWhetherThisLibTorchHasCuda) {
  EXPECT_EQ(ampp::cuda_graphs_compiled(), static_cast<bool>(AMPP_TEST_TORCH_HAS_CUDA));
}

TEST(CudaGraphStep, WithoutAGpuTheCauseAndTheFixAreNamed) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible: the GPU suite covers this machine";
  const char* cause = ampp::cuda_graphs_compiled() ? "no CUDA device" : "built without CUDA";
  auto x = torch::zeros({4, 3});
  EXPECT_THAT([&] { ampp::CudaGraphStep({x}, [&] { return x.sum(); }); },
              ::testing::ThrowsMessage<c10::Error>(::testing::AllOf(HasSubstr(cause), HasSubstr("Fix:"))));
}
