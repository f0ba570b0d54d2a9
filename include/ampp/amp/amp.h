#pragma once
// ampp::Amp: the handle ampp::initialize() returns (apex's amp module state, per model/optimizers).
//
//   auto amp = ampp::initialize(net, opt, ampp::OptLevel::O2);
//   for (auto& batch : loader) {
//     opt.zero_grad();                                  // or amp.zero_grad()
//     auto loss = criterion(amp.forward(net, batch.data), batch.target);
//     amp.scale_loss(loss).backward();                  // apex: with amp.scale_loss(loss, opt) as s: s.backward()
//     amp.step();                                       // apex: optimizer.step() (patched by apex)
//   }
//
// Unlike apex, ampp cannot patch optimizer.step(): call amp.step() instead of opt.step().
// The handle is a cheap shared reference; it refers to the model(s) and optimizer(s) passed to
// initialize(), which must outlive it.

#include <ampp/amp/nested_tensors.h>
#include <ampp/amp/properties.h>
#include <ampp/precision/autocast.h>
#include <ampp/scaling/grad_scaler.h>
#include <ampp/scaling/skip_ledger.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace ampp {

namespace detail {
struct AmpState;

template <typename T, typename = void>
struct has_arrow : std::false_type {};
template <typename T>
struct has_arrow<T, std::void_t<decltype(std::declval<T&>().operator->())>> : std::true_type {};

// What forward() is called on: through operator-> for a module holder, a std::shared_ptr or DDP, else the
// module itself (held by value).
template <typename Model>
auto* forward_target(Model& model) {
  if constexpr (has_arrow<Model>::value) {
    return model.operator->();
  } else {
    return &model;
  }
}
}  // namespace detail

/// apex's scale_loss() arguments other than the loss.
struct ScaleLossOptions {
  /// Which loss scaler to use (0..num_losses-1).
  TORCH_ARG(int64_t, loss_id) = 0;
  /// true: leave the gradients scaled (no unscale, no overflow check, no scale update), e.g. for all
  /// but the last micro-batch of gradient accumulation. A scale_loss() without it must follow before step().
  TORCH_ARG(bool, delay_unscale) = false;
  /// The optimizers this loss's gradients flow to (apex's `optimizers` argument). Empty: all of them.
  TORCH_ARG(std::vector<torch::optim::Optimizer*>, optimizers);
};

/// Time spent in ampp's machinery (Properties::profile(true)); all zero otherwise.
struct AmpProfile {
  double scaler_seconds = 0;  ///< scaling the loss, unscale + inf check, scale update
  double copy_seconds = 0;    ///< model grads -> FP32 master grads, masters -> model, stash bookkeeping
  double cast_seconds = 0;    ///< forward(): input and output casts
  int64_t steps = 0;          ///< step() calls
  double total_seconds() const { return scaler_seconds + copy_seconds + cast_seconds; }
};

/// apex's state_dict: {"loss_scaler0": {"loss_scale": double, "unskipped": int}, ...} (each entry a
/// GenericDict IValue); under O2 also "master_params": the FP32 masters in optimizer order (a TensorList),
/// so a round trip loses no precision. A StateDict (util/state_dict.h), as GradScaler::state_dict() is.
using AmpStateDict [[deprecated("use ampp::StateDict (ampp/util/state_dict.h); removed in 0.3")]] = StateDict;

/// What `amp.scale_loss(loss)` returns: backward() does apex's whole with-block.
class ScaledLoss {
 public:
  /// Stashes gradients already accumulated, runs autograd on loss.float() * scale, then (unless
  /// delay_unscale) copies new low-precision gradients into FP32 master gradients, unscales them with
  /// the loss scaler (one fused pass that also detects inf/NaN), adds the stash back and updates the
  /// scale; on overflow the next step() is skipped.
  void backward(bool retain_graph = false);
  /// loss.float() * scale (what apex's with-block yields).
  const torch::Tensor& tensor() const { return scaled_; }
  /// The scale used (a host read of it, made when asked).
  double scale() const;

 private:
  friend class Amp;
  ScaledLoss(std::shared_ptr<detail::AmpState> state, torch::Tensor scaled, torch::Tensor scale,
             ScaleLossOptions options);
  std::shared_ptr<detail::AmpState> state_;
  torch::Tensor scaled_;
  torch::Tensor scale_;  // a copy of the scale when the loss was scaled (float32, 0-dim; undefined: 1)
  ScaleLossOptions options_;
  bool done_ = false;
};

class Amp {
 public:
  explicit Amp(std::shared_ptr<detail::AmpState> state);

  /// apex: `with amp.scale_loss(loss, optimizers, loss_id) as scaled_loss: scaled_loss.backward()`.
  ScaledLoss scale_loss(const torch::Tensor& loss, ScaleLossOptions options = {});
  ScaledLoss scale_loss(const torch::Tensor& loss, int64_t loss_id);
  /// apex: `amp.scale_loss(loss, optimizer, loss_id=i)`: the loss's gradients belong to `optimizer`'s
  /// parameters, and an overflow in them skips that optimizer's next step alone.
  ScaledLoss scale_loss(const torch::Tensor& loss, torch::optim::Optimizer& optimizer, int64_t loss_id = 0);

  /// Steps every optimizer (apex's patched optimizer.step()). An optimizer whose gradients overflowed
  /// in a backward since the last step is skipped instead (its gradients are dropped, the scale was
  /// already lowered). Under O2 the FP32 masters are stepped and copied back into the model.
  /// Returns true if every optimizer stepped.
  ///
  /// With several optimizers (several models, as a GAN's), each must have gradients from a backward since
  /// its last step: stepping one that has none is an error naming step(optimizer), since it would change its
  /// model's weights between that model's forward and backward.
  ///
  /// A fused optimizer (ampp::FusedSGD, FusedAdamW) decides the skip itself, on the device: nothing is
  /// read on the host, so a GPU step stays asynchronous and a CUDA graph can capture it. It then counts
  /// as stepped here (true: "handed to the optimizer"); last_step_skipped() and skipped_steps() tell, and
  /// the skipped step's gradients stay until zero_grad() (a backward that accumulates onto them drops
  /// them first, as apex does at once).
  bool step();
  /// Steps `optimizer` alone (one this handle manages), as step() would, and under O2 copies only its
  /// masters into its model: apex's patched optimizer.step() for several models. A GAN steps the
  /// discriminator's optimizer after its backward, then the generator's after the generator's backward.
  bool step(torch::optim::Optimizer& optimizer);
  /// step() for a loop without loss scaling (checks_overflow() false: O0, or bf16 at a static scale of 1),
  /// which checks its unscaled gradients itself: every optimizer steps unless `skip` (float32, 0-dim,
  /// non-zero: inf/NaN, e.g. numerics::non_finite_check_and_unscale_'s found-inf flag) says they are not
  /// finite. A fused optimizer skips on the device; another reads the flag on the host. With a loss scaler
  /// both flags count. Recorded in ledger() as step() records.
  bool step_unless(const torch::Tensor& skip);
  /// Non-zero where the last step() skipped for inf/NaN gradients: ledger().skipped_flag(), float32,
  /// 0-dim, where the decision was made (no host read). Undefined before the first step(); zero after a
  /// step that nothing checked (checks_overflow() false and no step_unless()).
  const torch::Tensor& last_step_skipped() const;
  /// Each step()'s skip decision, one entry per step() call (the sum of its optimizers' flags): the one
  /// record of skips (Note [the skip ledger], skip_ledger.h). `ampp train` restores it from a checkpoint.
  const SkipLedger& ledger() const;
  SkipLedger& ledger();

  /// Zeroes the gradients of the optimizers' params (the masters under O2) and drops the model's.
  /// Cheaper than optimizer.zero_grad() (same result): the grads are dropped, the next
  /// scale_loss(...).backward() or step() gives zeros to any param the backward did not reach.
  void zero_grad();

  /// The region for the model's forward (and the loss): O1 -> ampp::autocast(device, dtype);
  /// O2/O3 -> ampp::autocast of the model's dtype (fp16 emulation on CPU; hardware-aware bf16 GEMMs);
  /// O0, casts to FP32 and disabled -> the caller's region, left as it is (docs/opt_levels.md).
  ampp::autocast autocast() const;

  /// apex's patched model.forward: runs `model->forward(args...)` inside autocast(), with floating
  /// tensor arguments cast to cast_model_type (O2/O3) and floating tensor outputs cast to
  /// cast_model_outputs (float32 by default), so the loss is computed in FP32. Tensors inside tuples,
  /// pairs, vectors, optionals and str-keyed maps, at any nesting (an LSTM's (output, (h, c))), are cast as
  /// bare ones are (nested_tensors.h); an output of another type passes through uncast, with a warning
  /// (once per type) that names it.
  /// The model: a module holder, a std::shared_ptr to a module, or a module itself (held by value). Use it
  /// for evaluation too: under O2/O3 a model called directly gets FP32 inputs for its low-precision
  /// weights ("Input type (float) and bias type (c10::BFloat16) should be the same").
  template <typename Model, typename... Args>
  auto forward(Model& model, Args&&... args) {
    auto region = forward_region();
    return cast_outputs(detail::forward_target(model)->forward(cast_arg(std::forward<Args>(args))...));
  }

  /// One input / output as forward() casts it.
  torch::Tensor cast_input(const torch::Tensor& input) const;
  torch::Tensor cast_output(const torch::Tensor& output) const;

  /// apex's amp.master_params(optimizer): the tensors the optimizer steps (FP32 masters under O2).
  /// Clip these (their grads are unscaled after backward()), not the model's parameters.
  std::vector<torch::Tensor> master_params() const;
  std::vector<torch::Tensor> master_params(const torch::optim::Optimizer& optimizer) const;
  /// The model parameter each master_params() entry belongs to, in the same order: the optimizers'
  /// order (param group by param group), which is not the model's once an optimizer has several groups.
  std::vector<torch::Tensor> model_params_of_masters() const;
  /// The FP32 buffers low-precision model gradients are converted into for the masters, kept between
  /// steps (so each step does not allocate them again) while the masters' .grad is dropped; empty
  /// before the first O2 backward and at O0, O1 and O3. For memory accounting.
  std::vector<torch::Tensor> master_gradient_buffers() const;

  /// Whether initialize() cast `param` (a model parameter) to the low-precision type, or rounded it to
  /// fp16 values in place under fp16 emulation: under O2 such a parameter has an FP32 master (under ZeRO,
  /// on the rank that steps it); the others (BatchNorm's, kept FP32) are their own master.
  bool was_cast(const torch::Tensor& param) const;

  /// Copies every FP32 master from its model parameter, e.g. after loading model weights from a
  /// checkpoint saved without the amp state (masters then start from the low-precision values).
  void sync_masters_from_model();

  StateDict state_dict() const;
  /// Restores the loss scalers and, if present, the masters (the model is refreshed from them).
  void load_state_dict(const StateDict& state);

  /// True when scale_loss(...).backward() checks the gradients for inf/NaN (and step() skips on
  /// them): a loss scaler is in use. False at apex's O0/O3 defaults (static scale 1.0) and disabled.
  bool checks_overflow() const;
  /// True when a backward since the last step() found inf/NaN gradients, so the next step() skips
  /// (and drops those gradients, as apex does): read the gradients before step() to see where. A host
  /// read of the flag (a synchronisation on a GPU).
  bool step_will_skip() const;
  /// The live scale of loss scaler `loss_id` (1.0 for a static 1.0 / disabled).
  double loss_scale(int64_t loss_id = 0) const;
  const GradScaler& scaler(int64_t loss_id = 0) const;
  /// Makes the processes agree on each backward's overflow before it is acted on: `reduce` runs on the
  /// found-inf flag first, e.g. FullyShardedDataParallel::found_inf_hook() (each rank checks only its shards).
  /// nullptr: no agreement (DDP's gradients are whole on every rank).
  void set_found_inf_reducer(FoundInfHook reduce);
  /// step() calls that skipped (any of their optimizers) because of overflow: ledger().skipped(), a host read.
  int64_t skipped_steps() const;
  /// The properties in force (level defaults + overrides, dtype resolved for the model's device).
  const Properties& properties() const;
  /// The dtype the model's cast parameters have (float32 carriers when fp16 is emulated on CPU).
  c10::ScalarType model_storage_dtype() const;
  /// True when fp16 is emulated on CPU (parameters hold fp16 values in float32 tensors).
  bool fp16_emulated() const;
  AmpProfile profile() const;

 private:
  // autocast(), and a note that a grad-enabled forward went through forward() (scale_loss checks it).
  ampp::autocast forward_region() const;
  // A tensor, or a copy of a container of them (detail::is_walkable_v) with each tensor cast; anything else as
  // it was passed.
  template <typename T>
  decltype(auto) cast_arg(T&& arg) const {
    using U = std::decay_t<T>;
    if constexpr (std::is_same_v<U, torch::Tensor>) {
      return cast_input(arg);
    } else if constexpr (detail::is_walkable_v<U>) {
      U copy = std::forward<T>(arg);
      detail::cast_nested(copy, [this](const torch::Tensor& t) { return cast_input(t); }, /*warn_unknown=*/false);
      return copy;
    } else {
      return std::forward<T>(arg);
    }
  }

  template <typename Out>
  Out cast_outputs(Out out) const {
    detail::cast_nested(out, [this](const torch::Tensor& t) { return cast_output(t); }, /*warn_unknown=*/true);
    return out;
  }

  std::shared_ptr<detail::AmpState> state_;
};

}  // namespace ampp
