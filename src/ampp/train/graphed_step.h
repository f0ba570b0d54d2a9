#pragma once
// Internal to ampp: TrainOptions::cuda_graphs, `ampp train`'s step as one CUDA graph.
//
// The step (the model's forward under the run's autocast, the loss, GradScaler's scaled backward, inf check
// and unscale, the fused SGD step, the scale update) keeps everything on the device: the skip decision
// stays there (ampp::FusedSGD takes GradScaler's tensors), and the loss and the correct predictions are
// summed there, read (one host synchronisation) only when the trainer logs. On a GPU it runs through
// ampp::CudaGraphStep: captured after its warm-up steps and replayed. A batch of another shape (an epoch's
// short last batch) runs eagerly, and a new learning rate captures anew (a graph keeps the lr it was
// captured with). Uncaptured (the CPU tests) every step runs eagerly, the path a GPU captures.
#include <ampp/scaling/cuda_graph_step.h>
#include <ampp/scaling/grad_scaler.h>

#include "skip_watch.h"

#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace ampp::train::detail {

// Of a batch's predictions (argmax over the last dimension), those equal to `target`: 0-dim int64, where
// the logits are (the graphed step sums it there; the eager trainer reads it every step).
inline torch::Tensor correct_prediction_count(const torch::Tensor& logits, const torch::Tensor& target) {
  return logits.argmax(-1).eq(target).sum();
}

// Every param group's learning rate, of SGD (the trainer's optimizer, plain, fused or ZeRO's).
inline void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
}

class GraphedTrainStep {
 public:
  // A batch's forward under the run's autocast: the logits, the loss, and the loss to backward (the same
  // one, but for the test faults' injected inf).
  struct Outputs {
    torch::Tensor logits, loss, to_backward;
  };
  using ForwardLoss = std::function<Outputs(const torch::Tensor& data, const torch::Tensor& target)>;

  // What the steps since the last read() summed, and where the scaler stands (host values).
  struct Readout {
    double loss_sum = 0;  // each step's loss times its targets
    double correct = 0;
    double seen = 0;
    double last_loss = 0;
    double loss_scale = 1;
    int64_t skipped_total = 0;                    // steps skipped for inf/NaN gradients since the start
    int64_t consecutive_overflows = 0;            // of the last steps, in a row (0: the last one stepped)
    int64_t steps = 0;                            // taken since the start
    std::optional<SkipWatch::Break> first_break;  // the first step that broke a divergence rule
  };

  // `max_consecutive_skips`: TrainOptions'; its rules are watched on the device (SkipWatch).
  GraphedTrainStep(ForwardLoss forward_loss, torch::optim::Optimizer& optimizer, const GradScalerOptions& scaler,
                   int64_t max_consecutive_skips, bool capture);

  // One training step on a batch already on the model's device, at learning rate `lr`.
  void step(const torch::Tensor& data, const torch::Tensor& target, double lr);
  // Reads the sums (and resets them) and the scaler: a host synchronisation.
  Readout read();
  bool captured() const { return graph_ && graph_->captured(); }
  // Its loss scaler, to save and restore with a checkpoint (between steps).
  GradScaler& scaler() { return scaler_; }

 private:
  torch::Tensor run_step(const torch::Tensor& data, const torch::Tensor& target);
  bool fits_graph(const torch::Tensor& data, const torch::Tensor& target) const;
  torch::Tensor skip_flag() const;

  ForwardLoss forward_loss_;
  torch::optim::Optimizer& optimizer_;
  GradScaler scaler_;
  SkipWatch watch_;
  bool capture_;
  int64_t steps_ = 0;
  std::unique_ptr<CudaGraphStep> graph_;
  double graph_lr_ = 0;               // the lr the graph was built with
  torch::Tensor loss_sum_, correct_;  // on the device, float64 and int64, added to in place by every step
  double seen_ = 0;                   // known on the host: the targets of each step
  torch::Tensor last_loss_;
};

}  // namespace ampp::train::detail
