#pragma once
// ampp::CudaGraphStep: a whole training step (forward under autocast, backward, GradScaler's inf check and
// unscale, the optimizer's step, the scale update) captured once as a CUDA graph and replayed, so that a
// step costs one launch instead of hundreds. PyTorch's "whole-network capture" (torch.cuda.graphs), with
// its rules checked instead of documented:
//
//   auto x = torch::empty({256, 1, 28, 28}, cuda), y = torch::empty({256}, cuda.dtype(torch::kLong));
//   ampp::CudaGraphStep step({x, y}, [&] {
//     opt.zero_grad();
//     torch::Tensor loss;
//     { ampp::autocast guard(torch::kCUDA, torch::kBFloat16); loss = torch::cross_entropy_loss(net(x), y); }
//     scaler.scale(loss).backward();
//     scaler.step(opt);        // ampp::FusedSGD / FusedAdamW: the skip decision stays on the GPU
//     scaler.update();         // ATen's _amp_update_scale_, on the GPU
//     return loss;
//   });
//   for (auto& [images, labels] : loader) loss = step({images, labels});   // a static tensor: clone to keep
//
// Each call is one training step on its inputs, the same as calling the function eagerly: the first
// `warmup_steps` calls run it eagerly on a side stream (cuDNN/cuBLAS handles, optimizer state and the
// scaler's tensors come to exist), the next one captures it and replays the capture once, every later one
// replays. What the function does on the host happens once, at capture: values read there (a learning
// rate given as a double, a step counter kept on the host) are frozen into the graph. ampp's fused
// optimizers and GradScaler keep theirs on the GPU, so dynamic loss scaling stays exact under replay.
//
// Refused with an error that names the cause and the fix, never a wrong replay: no CUDA GPU, inputs
// that are not on it, another shape or dtype than the captured one (a graph replays fixed shapes), a
// step that synchronises with the host (c10's sync debug mode, set to error during the last warm-up
// step: `.item()`, printing a loss, a GradScaler with an optimizer that is not fused), and autocast
// entered outside the function (its cast cache would hold casts of stale weights).
#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace ampp {

struct CudaGraphStepOptions {
  /// Eager steps on a side stream before the capture, at least 1: what a step creates lazily (cuBLAS
  /// handles, optimizer state) cannot be created inside a capture. PyTorch's examples take 3.
  TORCH_ARG(int64_t, warmup_steps) = 3;
};

class CudaGraphStep {
 public:
  using StepFunction = std::function<torch::Tensor()>;
  /// `static_inputs`: CUDA tensors the function reads; each call copies its inputs into them.
  CudaGraphStep(std::vector<torch::Tensor> static_inputs, StepFunction step, CudaGraphStepOptions options = {});
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  /// One training step on `inputs` (the static inputs' shapes and dtypes; any device). Returns the
  /// function's result, which the next call overwrites under replay.
  const torch::Tensor& operator()(const std::vector<torch::Tensor>& inputs);

  bool captured() const { return captured_; }
  int64_t steps() const { return steps_; }
  const std::vector<torch::Tensor>& static_inputs() const { return static_inputs_; }

 private:
  void copy_inputs(const std::vector<torch::Tensor>& inputs);
  void run_eagerly_on_side_stream(bool last_warmup_step);
  void capture();

  std::vector<torch::Tensor> static_inputs_;
  StepFunction step_;
  CudaGraphStepOptions options_;
  torch::Tensor output_;
  bool captured_ = false;
  int64_t steps_ = 0;
  struct Graph;  // at::cuda::CUDAGraph and its stream, in CUDA builds only
  std::unique_ptr<Graph> graph_;
};

/// Whether this LibTorch was built with CUDA (CUDA graphs can be captured where a GPU is also visible).
bool cuda_graphs_compiled();

/// While alive, a CUDA call that synchronises the host with the GPU (`.item()`, a copy to the host, a
/// blocking wait) throws a c10::Error naming the call: c10's sync debug mode set to error, as
/// `torch.cuda.set_sync_debug_mode("error")`; the mode before is restored at the end. CudaGraphStep uses
/// it on its last warm-up step; a user loop can use it to prove a step free of host synchronisations.
/// Does nothing in a LibTorch built without CUDA.
class ErrorOnCudaSync {
 public:
  ErrorOnCudaSync();
  ~ErrorOnCudaSync();
  ErrorOnCudaSync(const ErrorOnCudaSync&) = delete;
  ErrorOnCudaSync& operator=(const ErrorOnCudaSync&) = delete;

 private:
  int mode_before_ = 0;  // a c10::cuda::SyncDebugMode, kept as int so that this header needs no CUDA header
};

}  // namespace ampp
