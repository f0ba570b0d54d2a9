#pragma once
// ampp::GradScaler: PyTorch's dynamic loss scaling (torch.amp.GradScaler's semantics) for
// LibTorch optimizers, plus the scale policies other frameworks use (static scale, max cap, min floor,
// hysteresis) as options on the same class. Semantics and decisions: docs/grad_scaler.md.
//
//   ampp::GradScaler scaler;                       // 2^16, x2, x0.5, every 2000 clean steps
//   scaler.scale(loss).backward();
//   scaler.unscale_(opt);                          // optional: to clip/inspect TRUE gradients
//   torch::nn::utils::clip_grad_norm_(params, 5.0);
//   scaler.step(opt);                              // skips opt.step() if any grad is inf/NaN
//   scaler.update();                               // once per iteration, after every step()

#include <ampp/scaling/skip_ledger.h>
#include <ampp/util/state_dict.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace ampp {

class GradScaleAwareOptimizer;  // fused_optimizers.h
struct GradScalerOptions;

/// Whether `options` are PyTorch's rule exactly (dynamic, no cap, no floor of the user's, no hysteresis):
/// ATen's _amp_update_scale_ alone.
bool plain_pytorch_rule(const GradScalerOptions& options);

/// The smallest loss scale ampp uses: 2^-126, float32's smallest normal number. PyTorch lets the scale
/// back off further, into subnormals, until 1/scale overflows (below about 2.9e-39) and finite
/// gradients unscale to inf/NaN that its check (made before unscaling) does not see. In ampp the
/// backoff stops here, whatever `min_scale` says; reaching it counts as reaching `min_scale`
/// (`at_min_scale` decides what happens next). It takes ~142 consecutive backoffs from 2^16.
constexpr double kMinLossScale = 0x1p-126;

/// What update() does when a step overflows while the scale already sits at `min_scale`
/// (and keeps doing so for `min_scale_patience` consecutive overflowing updates).
enum class MinScaleAction {
  kError,   ///< throw (DeepSpeed raise_error_at_min_scale=True); state stays consistent, call update() again to go on
  kWarn,    ///< TORCH_WARN once per streak and keep skipping steps
  kIgnore,  ///< silently keep skipping steps at the floor
};

struct GradScalerOptions {
  // ---- PyTorch (torch.cuda.amp.GradScaler) arguments, same defaults ----
  /// Initial scale; the live scale is created lazily on the first scale() call.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Multiplier after `growth_interval` consecutive finite steps. Must be > 1.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Multiplier on a step with inf/NaN gradients. Must be < 1 (and > 0 in ampp).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Consecutive finite steps before growing. Must be >= 1 in ampp (PyTorch does not check).
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// false: every method is a pass-through (scale() identity, step() == optimizer.step()).
  TORCH_ARG(bool, enabled) = true;

  // ---- ampp policies (defaults reproduce PyTorch exactly) ----
  /// false: static loss scale (apex loss_scale=128.0): the scale stays `init_scale` forever;
  /// steps with inf/NaN gradients are still skipped and counted.
  TORCH_ARG(bool, dynamic) = true;
  /// Growth never takes the scale above this (insightface MaxClipGradScaler, apex max_loss_scale 2^24).
  /// Default +inf = no cap, as PyTorch's.
  TORCH_ARG(double, max_scale) = std::numeric_limits<double>::infinity();
  /// Backoff never takes the scale below this (DeepSpeed/apex min_loss_scale). 0 = no floor of the
  /// user's (PyTorch); the scale still never goes below kMinLossScale.
  TORCH_ARG(double, min_scale) = 0.0;
  /// Action once `min_scale_patience` consecutive updates overflowed with the scale at the floor
  /// (max(min_scale, kMinLossScale)). kError by default: such gradients overflow at any scale.
  TORCH_ARG(MinScaleAction, at_min_scale) = MinScaleAction::kError;
  /// Consecutive overflowing updates at the floor that are tolerated before `at_min_scale` fires.
  /// 1 = DeepSpeed: the first overflow that finds the scale already at min_scale.
  TORCH_ARG(int64_t, min_scale_patience) = 1;
  /// Back off only on the N-th overflow (DeepSpeed delayed_shift / Megatron hysteresis). 1 = PyTorch.
  /// Overflowing steps are always skipped and always reset the growth tracker.
  TORCH_ARG(int64_t, hysteresis) = 1;
  /// true: any finite step refills the hysteresis budget, so only N overflows IN A ROW back off
  /// (DeepSpeed consecutive_hysteresis=True, apex update_scale_hysteresis).
  /// false: the budget is refilled only when the scale grows (DeepSpeed default, Megatron).
  TORCH_ARG(bool, consecutive_hysteresis) = true;
  /// PyTorch rejects fp16 gradients in unscale_ ("Attempting to unscale FP16 gradients.").
  /// true allows them (apex O3-style pure-fp16 training, where apex only warns).
  TORCH_ARG(bool, allow_fp16_grads) = false;
};

/// PyTorch's OptState.
enum class OptState : int { kReady = 0, kUnscaled = 1, kStepped = 2 };

/// Called on the combined found_inf tensor (float32, 1 element, non-zero = overflow) of one optimizer
/// inside unscale_, before the skip decision. It may change the flag (all-reduce it, SUM or MAX,
/// across processes when gradients are unscaled before being reduced: Megatron, sharded optimizers;
/// DDP does not need it) or only look at it (ampp::initialize records overflows this way).
using FoundInfHook = std::function<void(torch::Tensor& found_inf)>;

/// state_dict(): PyTorch's keys "scale" (double), "growth_factor" (double), "backoff_factor" (double),
/// "growth_interval" (int), "_growth_tracker" (int); ampp extras "_ampp_hysteresis_tracker",
/// "_ampp_skipped_steps", "_ampp_min_scale_overflows" (ints), in that order. Empty when disabled. A StateDict
/// (util/state_dict.h), so it nests in a checkpoint's dict as it is.
using GradScalerStateDict [[deprecated("use ampp::StateDict (ampp/util/state_dict.h); removed in 0.3")]] = StateDict;

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  /// Copies are independent (the scale and tracker tensors are cloned, not shared); per-iteration
  /// optimizer stages are copied too.
  GradScaler(const GradScaler& other);
  GradScaler& operator=(const GradScaler& other);
  GradScaler(GradScaler&&) noexcept = default;
  GradScaler& operator=(GradScaler&&) noexcept = default;
  ~GradScaler() = default;

  // ---- PyTorch API ----
  /// Returns `outputs * scale` (out of place). Lazily creates the scale on outputs' device.
  torch::Tensor scale(const torch::Tensor& outputs);
  std::vector<torch::Tensor> scale(const std::vector<torch::Tensor>& outputs);

  /// Divides the optimizer's gradients by the scale in place (one fused pass) and records
  /// whether any is inf/NaN. At most once per optimizer between update() calls.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Calls unscale_ if not done, then optimizer.step() unless a gradient was inf/NaN.
  /// Returns true if optimizer.step() ran. A closure is rejected when enabled (as in PyTorch).
  /// A GradScaleAwareOptimizer (FusedSGD, FusedAdamW: fused_optimizers.h) is PyTorch's fused path
  /// instead: a non-finite check without unscaling (unless unscale_ ran), then its step() with the
  /// scale and the found-inf flag, which unscales and skips on the device. No value is read on the
  /// host: it returns true for "handed to the optimizer", and found_inf_last_step() tells on demand.
  bool step(torch::optim::Optimizer& optimizer, torch::optim::Optimizer::LossClosure closure = nullptr);

  /// Adjusts the scale from the overflow results of all optimizers since the last update
  /// (growth-tracker rule of _amp_update_scale_ plus ampp policies), then resets every optimizer to READY.
  /// Reads nothing on the host (so a GPU step stays asynchronous and a CUDA graph can capture it) when
  /// every optimizer stepped through the fused path, or when `at_min_scale` is kIgnore: the rule, the
  /// cap, the floor and hysteresis then run as tensor operations where the scale is. Otherwise (the
  /// floor's kError/kWarn must act on the host at once) the same rule runs on the host.
  void update();
  /// Sets the scale directly (growth tracker untouched, overflow results discarded).
  void update(double new_scale);

  double get_scale() const;
  bool is_enabled() const { return options_.enabled(); }
  double get_growth_factor() const { return options_.growth_factor(); }
  void set_growth_factor(double v) { options_.growth_factor(v); }  // not re-validated (as PyTorch)
  double get_backoff_factor() const { return options_.backoff_factor(); }
  void set_backoff_factor(double v) { options_.backoff_factor(v); }  // not re-validated (as PyTorch)
  int64_t get_growth_interval() const { return options_.growth_interval(); }
  void set_growth_interval(int64_t v) { options_.growth_interval(v); }  // not re-validated (as PyTorch)
  /// PyTorch's _get_growth_tracker(): consecutive finite steps since the last growth/overflow.
  int64_t get_growth_tracker() const;

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);
  /// torch::serialize archive form of state_dict() (for torch::save-style checkpoints).
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

  // ---- ampp extras ----
  const GradScalerOptions& options() const { return options_; }
  /// Stage of `optimizer` in the current iteration (kReady if never seen).
  OptState stage(const torch::optim::Optimizer& optimizer) const;
  /// true if the most recent step() call skipped optimizer.step() because of inf/NaN gradients (a host
  /// read of ledger()).
  bool found_inf_last_step() const { return ledger_.last_skipped(); }
  /// Number of optimizer.step() calls skipped since construction (saved in state_dict; a host read of ledger()).
  int64_t skipped_steps() const { return ledger_.skipped(); }
  /// Every step() call's skip decision, where it was made (Note [the skip ledger], skip_ledger.h).
  const SkipLedger& ledger() const { return ledger_; }
  /// Updates in a row whose gradients held inf/NaN (0 after a finite one; not saved in state_dict).
  int64_t consecutive_overflows() const;
  /// Remaining overflows before the next backoff (== hysteresis when none is pending).
  int64_t hysteresis_tracker() const;
  /// The parameters whose gradients held inf/NaN after unscaling, in this iteration (every unscale_
  /// since the last update(); after update(), those of the iteration it closed). From the fused
  /// unscale pass itself on CPU: no extra pass. Map them to names with overflowed_parameter_names().
  /// Empty for gradients on a GPU, where attributing them would read the device on the host every step.
  /// Under DDP the gradients are already averaged, so every rank sees the same list.
  const std::vector<torch::Tensor>& overflowed_params() const { return overflowed_params_; }
  /// Hook that reduces or observes found_inf inside unscale_ (see FoundInfHook). nullptr removes it.
  void set_found_inf_hook(FoundInfHook reducer) { found_inf_hook_ = std::move(reducer); }

  /// The live scale tensor (float32, 0-dim), undefined before the first scale() when enabled.
  const torch::Tensor& scale_tensor() const { return scale_; }
  /// The last step's skip flag where it was decided (float32, 0-dim, non-zero = the step was skipped):
  /// ledger().skipped_flag(), updated in place by every step without a host read (so a captured CUDA
  /// graph's step updates it too); undefined before the first step.
  const torch::Tensor& found_inf_on_device() const { return ledger_.skipped_flag(); }

 private:
  struct PerOptimizerState {
    OptState stage = OptState::kReady;
    std::map<std::string, torch::Tensor> found_inf_per_device;  // key: device string
    bool fused = false;  // stepped through a GradScaleAwareOptimizer (no host read so far)
  };
  // What the device's update rule counts, kept where the scale is (0-dim) until a host read folds them
  // into the host counts below; undefined before the first update there. A fold keeps the tensors (a
  // captured CUDA graph goes on updating them: cuda_graph_step.h) and restarts device_updates. The skips
  // are not here: ledger_ holds them.
  struct OnDeviceCounts {
    torch::Tensor consecutive_overflows, hysteresis_tracker, floor_overflows;  // as of the last update
    torch::Tensor device_updates;                                              // since the last fold
  };

  void check_scale_growth_tracker(const char* funcname) const;
  void lazy_init_scale_growth_tracker(const torch::Device& device);
  double floor_scale() const { return std::max(options_.min_scale(), kMinLossScale); }
  void apply_policy_rule(bool found);
  bool step_fused(torch::optim::Optimizer& optimizer, GradScaleAwareOptimizer& fused);
  void check_inf_per_device(torch::optim::Optimizer& optimizer);
  torch::Tensor found_inf_sum(const PerOptimizerState& st) const;
  void reduce_found_inf_with_hook(PerOptimizerState& st);
  bool update_on_device(const torch::Tensor& found_inf_combined, bool all_fused);
  void update_on_host(const torch::Tensor& found_inf_combined);
  void apply_policy_rule_on_device(const torch::Tensor& overflow);
  OnDeviceCounts& on_device_counts();
  void fold_on_device_counts() const;
  void overflow_at_floor(double scale);
  PerOptimizerState& state_of(const torch::optim::Optimizer& optimizer);

  GradScalerOptions options_;
  torch::Tensor scale_;  // float32 0-dim, lazily created
  // A bound the scale is known to be at or above, kept on the host without reading the scale: exact
  // where the host learns it (a read, a fill), and lowered by the backoff factor at each update on the
  // device. At 1 or above, unscaling multiplies by at most 1, and one check pass suffices on a GPU.
  mutable double scale_at_least_ = 0;
  torch::Tensor growth_tracker_;  // int32 0-dim, lazily created
  int64_t init_growth_tracker_ = 0;
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizerState> per_optimizer_states_;

  FoundInfHook found_inf_hook_;
  SkipLedger ledger_;                 // each step()'s skip decision
  mutable OnDeviceCounts on_device_;  // mutable: the const readers fold it into the three below
  mutable int64_t hysteresis_tracker_ = 1;
  mutable int64_t min_scale_overflows_ = 0;  // consecutive overflowing updates that found the scale at the floor
  mutable int64_t consecutive_overflows_ = 0;
  std::vector<torch::Tensor> overflowed_params_;
  bool iteration_closed_ = true;      // update() ran since the last unscale_
  bool scaled_since_update_ = false;  // scale() ran since the last update(): step()'s gradients can be scaled
};

/// Module paths ("layer2.conv1.weight") of scaler.overflowed_params() that belong to `module`, in the
/// order the scaler found them (parameters of other modules, e.g. FP32 master copies, are left out).
std::vector<std::string> overflowed_parameter_names(const GradScaler& scaler, const torch::nn::Module& module);

/// A number from a GradScaler state dict, as PyTorch's load_state_dict takes it (it fill_()s a tensor
/// with it): a float, an int or a one-element tensor; anything else is an error naming `key`.
double state_number(const c10::IValue& value, const char* key);
/// state_number() that must be a whole number >= 0 (growth_interval, _growth_tracker, counters).
int64_t state_count(const c10::IValue& value, const char* key);

}  // namespace ampp
