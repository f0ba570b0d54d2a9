#pragma once
// Internal to ampp: TrainOptions::cuda_graphs, `ampp train`'s step replayed as one CUDA graph.
//
// The step is the eager trainer's own (trainer.cpp's train_step and the StepTally it adds to): it reads
// nothing on the host, so ampp::CudaGraphStep captures it after its warm-up steps and replays it. A batch
// of another shape (an epoch's short last batch) runs eagerly, and a new learning rate captures anew (a
// graph keeps the lr it was captured with).
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

  // The step on this batch at learning rate `lr` (which the caller has set in the optimizer).
  void step(const torch::Tensor& data, const torch::Tensor& target, double lr);
  bool captured() const { return graph_ && graph_->captured(); }

 private:
  bool fits_graph(const torch::Tensor& data, const torch::Tensor& target) const;

  StepFunction step_;
  std::unique_ptr<CudaGraphStep> graph_;
  double graph_lr_ = 0;  // the lr the graph was built with
};

}  // namespace ampp::train::detail
