#pragma once
// The state behind an ampp::Amp handle (shared by the handle's copies and its ScaledLoss objects).

#include <ampp/amp/amp.h>
#include <ampp/amp/properties.h>
#include <ampp/scaling/grad_scaler.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <chrono>
#include <memory>
#include <vector>

namespace ampp::detail {

/// One parameter slot of an optimizer, in param-group order.
struct ParamSlot {
  torch::Tensor param;  ///< what the optimizer steps: the FP32 master under O2, else the model's parameter
  torch::Tensor model;  ///< the low-precision model parameter `param` mirrors; undefined if param is its own master
  torch::Tensor stash;  ///< gradient accumulated before the current backward (apex's stashed grads)
  /// FP32 buffer the model's low-precision grad is converted into, kept across steps: a fresh
  /// allocation per step costs page faults that showed up as most of O2's copy time on small models.
  torch::Tensor master_grad_buffer;
};

struct OptimizerRecord {
  torch::optim::Optimizer* optimizer = nullptr;
  std::vector<ParamSlot> slots;
  /// Non-zero where a backward since the last step overflowed, so that step is skipped: float32, 0-dim,
  /// where the scale is, summed from each backward's flag (no host read); undefined: no backward checked.
  torch::Tensor skip_flag;
  /// The flag of a step the optimizer skipped on the device (a fused one), whose inf/NaN gradients it left
  /// in place (apex drops them at once): a backward that accumulates onto them before zero_grad() drops
  /// them first (scale_loss.cpp). Undefined once zero_grad() or such a backward ran.
  torch::Tensor skipped_on_device;
  bool has_scaled_grads = false;  ///< delay_unscale backward(s) left scaled grads behind
  /// Amp::zero_grad() left the grads undefined instead of writing zeros: the next backward's grads
  /// need no stash and no add, and a param that gets no grad is given zeros afterwards, which is
  /// what LibTorch's zero_grad() would have left (so the optimizer still steps it).
  bool zero_grads_pending = false;
  /// A ShardedOptimizer under masters: it copies its masters into the model itself, inside its step.
  bool sharded = false;
};

struct AmpState {
  Properties props;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  c10::ScalarType low_dtype = c10::kBFloat16;  ///< autocast / cast dtype (resolved)
  c10::optional<c10::ScalarType> cast_type;    ///< what the model was cast to (nullopt: not cast)
  bool model_cast_low = false;                 ///< cast_type is a low-precision type
  bool emulate_fp16 = false;                   ///< fp16 on CPU: float32 carriers with fp16 values
  bool use_masters = false;
  bool scales_loss = false;              ///< false: static 1.0 and no masters -> plain backward
  bool trained_through_forward = false;  ///< a grad-enabled Amp::forward ran (scale_loss's O2/O3 check)
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  std::vector<torch::Tensor> cast_params;  ///< model parameters that were cast (or fp16-rounded)
  std::vector<OptimizerRecord> optimizers;
  std::vector<std::unique_ptr<GradScaler>> scalers;  ///< one per loss_id
  torch::Tensor overflow;  ///< the current backward's flag, summed from inside GradScaler::unscale_ (no host read)
  SkipLedger ledger;       ///< each step()'s skip decision: Amp::ledger()
  AmpProfile profile;

  bool enabled() const { return props.enabled(); }
  /// The records of `subset` (all if empty); throws for an optimizer the handle does not manage.
  std::vector<OptimizerRecord*> records_for(const std::vector<torch::optim::Optimizer*>& subset);
};

/// Masters -> low-precision model parameters of `rec` (a rounding copy).
void copy_masters_to_model(const AmpState& st, const OptimizerRecord& rec);

/// Gives every param of `rec` without a grad the zeros that zero_grad() deferred (see zero_grads_pending).
void fill_pending_zero_grads(OptimizerRecord& rec);

/// Whether any parameter of `rec` holds a gradient: its own (the master's under O2) or its model's.
bool has_gradients(const OptimizerRecord& rec);

/// Whether `rec`'s pending step is to be skipped: a host read of its flag (false when none is set).
bool skip_decided_on_host(const OptimizerRecord& rec);

/// Adds the elapsed time to `*sink` on destruction when `on`.
class Stopwatch {
 public:
  Stopwatch(bool on, double* sink) : sink_(on ? sink : nullptr) {
    if (sink_) start_ = std::chrono::steady_clock::now();
  }
  ~Stopwatch() {
    if (sink_) sink_[0] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

 private:
  double* sink_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ampp::detail
