// GraphedTrainStep (graphed_step.h): the trainer's step, captured once and replayed.
#include "graphed_step.h"

namespace ampp::train::detail {

bool GraphedTrainStep::fits_graph(const torch::Tensor& data, const torch::Tensor& target) const {
  const auto& inputs = graph_->static_inputs();
  return data.sizes() == inputs[0].sizes() && target.sizes() == inputs[1].sizes() &&
         data.scalar_type() == inputs[0].scalar_type() && target.scalar_type() == inputs[1].scalar_type();
}

void GraphedTrainStep::step(const torch::Tensor& data, const torch::Tensor& target) {
  if (!graph_) {
    std::vector<torch::Tensor> inputs{torch::empty_like(data), torch::empty_like(target)};
    graph_ = std::make_unique<CudaGraphStep>(inputs, [this, inputs] {
      step_(inputs[0], inputs[1]);
      return inputs[0];  // the trainer reads its results from its StepTally, not from the graph's output
    });
  }
  if (fits_graph(data, target))
    (*graph_)({data, target});
  else
    step_(data, target);  // another shape: eagerly, on the same parameters and state
}

}  // namespace ampp::train::detail
