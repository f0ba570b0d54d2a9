#pragma once
// Internal to ampp: TrainOptions::cuda_graphs, `ampp train`'s step replayed as one CUDA graph.
//
// The step is the eager trainer's own (trainer.cpp's train_step and the StepTally it adds to): it reads
// nothing on the host, so ampp::CudaGraphStep captures it after its warm-up steps and replays it. A batch
// of another shape (an epoch's short last batch) runs eagerly. The lr is a tensor the step looks up
// (step_lr.h), so one capture serves every lr.
#include <ampp/scaling/cuda_graph_step.h>

#include <torch/types.h>

#include <functional>
#include <memory>

namespace ampp::train::detail {

class GraphedTrainStep {
 public:
  // One training step on a batch on the model's device, queued with nothing read on the host.
  using StepFunction = std::function<void(const torch::Tensor& data, const torch::Tensor& target)>;

  explicit GraphedTrainStep(StepFunction step) : step_(std::move(step)) {}

  // The step on this batch.
  void step(const torch::Tensor& data, const torch::Tensor& target);
  bool captured() const { return graph_ && graph_->captured(); }

 private:
  bool fits_graph(const torch::Tensor& data, const torch::Tensor& target) const;

  StepFunction step_;
  std::unique_ptr<CudaGraphStep> graph_;
};

}  // namespace ampp::train::detail
