#pragma once
// What every GPU test file needs: the reason a test skips without a GPU, and c10's sync debug mode as a guard.
#include <ampp/scaling/cuda_graph_step.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "ampp_test.h"

namespace ampp_gpu_test {

inline std::string no_gpu_reason() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return AMPP_TEST_TORCH_HAS_CUDA
             ? std::string(
                   "no CUDA device: this LibTorch has CUDA, but torch::cuda::is_available() is false (no GPU "
                   "or driver on this machine; CUDA_VISIBLE_DEVICES='") +
                   (visible ? visible : "") + "')"
             : "no CUDA device: this LibTorch is CPU-only (a CUDA build: AMPP_TORCH=cuda, or scripts/gpu-check.sh "
               "on a machine with a GPU)";
}

// Raises a c10::Error at any synchronising CUDA call (c10's sync debug mode) while alive.
using ampp::ErrorOnCudaSync;

// cuDNN's deterministic algorithms and no benchmark mode while alive, so that the same training run twice
// gives the same bits: with the autotuner on, two runs may pick different weight-gradient algorithms,
// which sum in different orders.
class DeterministicCudnn {
 public:
  DeterministicCudnn()
      : deterministic_(at::globalContext().deterministicCuDNN()), benchmark_(at::globalContext().benchmarkCuDNN()) {
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  ~DeterministicCudnn() {
    at::globalContext().setDeterministicCuDNN(deterministic_);
    at::globalContext().setBenchmarkCuDNN(benchmark_);
  }
  DeterministicCudnn(const DeterministicCudnn&) = delete;
  DeterministicCudnn& operator=(const DeterministicCudnn&) = delete;

 private:
  bool deterministic_, benchmark_;
};

}  // namespace ampp_gpu_test

#define AMPP_REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << ampp_gpu_test::no_gpu_reason()
