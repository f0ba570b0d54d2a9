// GraphedTrainStep (graphed_step.h): TrainOptions::cuda_graphs' step, captured or eager.
#include "graphed_step.h"

namespace ampp::train::detail {

GraphedTrainStep::GraphedTrainStep(ForwardLoss forward_loss, torch::optim::Optimizer& optimizer,
                                   const GradScalerOptions& scaler, int64_t max_consecutive_skips, bool capture)
    : forward_loss_(std::move(forward_loss)),
      optimizer_(optimizer),
      scaler_(scaler),
      watch_(max_consecutive_skips),
      capture_(capture) {}

// The step itself: what a graph captures. Nothing in it reads a device value on the host.
torch::Tensor GraphedTrainStep::run_step(const torch::Tensor& data, const torch::Tensor& target) {
  optimizer_.zero_grad();
  const auto [logits, loss, to_backward] = forward_loss_(data, target);
  scaler_.scale(to_backward).backward();
  scaler_.step(optimizer_);  // a fused optimizer takes the scale and the inf flag: the skip stays on the device
  scaler_.update();
  watch_.after_step(skip_flag());
  torch::NoGradGuard no_grad;
  if (!loss_sum_.defined()) {  // made by the first (eager) step, before any capture
    loss_sum_ = torch::zeros({}, loss.options().dtype(torch::kDouble));
    correct_ = torch::zeros({}, loss.options().dtype(torch::kLong));
  }
  // As the eager trainer sums them: the float loss in double times the targets, and argmax hits. The
  // trainer adds these partial sums to its own; float values in double add exactly (a few dozen bits of
  // 53), so the grouping does not change the epoch's sum.
  loss_sum_.add_(loss.detach().to(torch::kDouble) * static_cast<double>(target.numel()));
  correct_.add_(correct_prediction_count(logits.detach(), target));
  return loss.detach();
}

// This step's inf/NaN flag on the device: the fused step's. Uncaptured on the CPU the optimizer is
// torch::optim::SGD (FusedSGD is a GPU default), and GradScaler's host path tells (a host read, which
// only a capture forbids).
torch::Tensor GraphedTrainStep::skip_flag() const {
  const torch::Tensor& fused = scaler_.found_inf_on_device();
  if (fused.defined() || capture_) return fused;
  return torch::tensor(scaler_.found_inf_last_step() ? 1.0F : 0.0F);
}

bool GraphedTrainStep::fits_graph(const torch::Tensor& data, const torch::Tensor& target) const {
  const auto& inputs = graph_->static_inputs();
  return data.sizes() == inputs[0].sizes() && target.sizes() == inputs[1].sizes() &&
         data.scalar_type() == inputs[0].scalar_type() && target.scalar_type() == inputs[1].scalar_type();
}

void GraphedTrainStep::step(const torch::Tensor& data, const torch::Tensor& target, double lr) {
  set_lr(optimizer_, lr);
  seen_ += static_cast<double>(target.numel());
  ++steps_;
  if (!capture_) {
    last_loss_ = run_step(data, target);
    return;
  }
  if (graph_ && graph_lr_ != lr) graph_.reset();  // the graph holds the lr it was captured with
  if (!graph_) {
    std::vector<torch::Tensor> inputs{torch::empty_like(data), torch::empty_like(target)};
    graph_ = std::make_unique<CudaGraphStep>(inputs, [this, inputs] { return run_step(inputs[0], inputs[1]); });
    graph_lr_ = lr;
  }
  if (fits_graph(data, target))
    last_loss_ = (*graph_)({data, target});
  else
    last_loss_ = run_step(data, target).clone();  // another shape: eagerly, on the same parameters and state
}

GraphedTrainStep::Readout GraphedTrainStep::read() {
  Readout r;
  if (!loss_sum_.defined()) return r;
  r.loss_sum = loss_sum_.item<double>();
  r.correct = static_cast<double>(correct_.item<int64_t>());
  r.seen = seen_;
  r.last_loss = last_loss_.item<double>();
  r.loss_scale = scaler_.get_scale();
  r.skipped_total = scaler_.skipped_steps();
  r.consecutive_overflows = scaler_.consecutive_overflows();
  r.steps = steps_;
  r.first_break = watch_.first_break();
  loss_sum_.zero_();
  correct_.zero_();
  seen_ = 0;
  return r;
}

}  // namespace ampp::train::detail
