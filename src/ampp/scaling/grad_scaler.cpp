// GradScaler: PyTorch 1.13's torch.cuda.amp.GradScaler state machine on LibTorch optimizers, with the
// scale arithmetic in ampp::numerics. Policies beyond PyTorch (static, max cap, min floor,
// hysteresis) switch update() from ATen's growth-tracker kernel to the host-side rule below, which
// reduces to the same arithmetic when every policy is at its default.

#include <ampp/scaling/grad_scaler.h>

#include <ampp/precision/autocast.h>
#include <ampp/scaling/fused_optimizers.h>

#include <ampp/numerics/unscale.h>
#include <ampp/numerics/update_scale.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "device_grads.h"
#include "graph_capture_scope.h"
#include "torch_compat.h"

namespace ampp {
namespace {

// PyTorch's docs advise against backward passes under autocast: their ops would run in autocast's precision
// (a GAN's losses differed by a third). A hook on the scaled loss sees the region the backward runs in (the
// autograd engine carries the caller's autocast state to its threads).
void warn_if_backward_under_autocast(torch::Tensor& scaled) {
  const auto device = scaled.device().type();
  scaled.register_hook([device](const torch::Tensor&) {
    if (is_autocast_enabled(device)) {
      TORCH_WARN_ONCE(
          "ampp: a backward runs inside an autocast region (an ampp::autocast or amp.autocast() "
          "still alive): its ops run in autocast's precision, which PyTorch's docs advise against. "
          "Close the region after the forward and the loss, before backward() and the step");
    }
  });
}

void validate(const GradScalerOptions& o) {
  // PyTorch's two checks first (its messages), then ampp's (PyTorch accepts these silently and
  // produces a NaN/zero scale or never grows).
  TORCH_CHECK(o.growth_factor() > 1.0, "The growth factor must be > 1.0. Got ", o.growth_factor(),
              "; pass GradScalerOptions().growth_factor(x) with x > 1 (PyTorch's default is 2.0).");
  TORCH_CHECK(o.backoff_factor() < 1.0, "The backoff factor must be < 1.0. Got ", o.backoff_factor(),
              "; pass GradScalerOptions().backoff_factor(x) with 0 < x < 1 (PyTorch's default is 0.5).");
  TORCH_CHECK(o.backoff_factor() > 0.0, "The backoff factor must be > 0.0. Got ", o.backoff_factor(),
              "; pass GradScalerOptions().backoff_factor(x) with 0 < x < 1 (PyTorch's default is 0.5).");
  TORCH_CHECK(std::isfinite(o.init_scale()) && o.init_scale() >= kMinLossScale,
              "The initial scale must be finite and >= 2^-126 (kMinLossScale; below it 1/scale overflows "
              "float32 soon). Got ",
              o.init_scale(), "; pass GradScalerOptions().init_scale(x), e.g. 65536 (2^16, PyTorch's default).");
  TORCH_CHECK(o.growth_interval() >= 1, "The growth interval must be >= 1. Got ", o.growth_interval(),
              "; pass GradScalerOptions().growth_interval(n) with n >= 1 (PyTorch's default is 2000).");
  TORCH_CHECK(o.max_scale() > 0.0, "max_scale must be > 0 (or +inf for no cap). Got ", o.max_scale(), ".");
  TORCH_CHECK(std::isfinite(o.min_scale()) && o.min_scale() >= 0.0,
              "min_scale must be finite and >= 0 (0 = no floor). Got ", o.min_scale(), ".");
  TORCH_CHECK(o.min_scale() <= o.init_scale() && o.init_scale() <= o.max_scale(), "init_scale (", o.init_scale(),
              ") must lie in [min_scale, max_scale] = [", o.min_scale(), ", ", o.max_scale(),
              "]; lower init_scale to at most max_scale (apex uses min(init_scale, max_loss_scale)) "
              "or widen the bounds.");
  TORCH_CHECK(o.hysteresis() >= 1, "hysteresis must be >= 1 (1 = back off on every overflow, as PyTorch). Got ",
              o.hysteresis(), ".");
  TORCH_CHECK(o.min_scale_patience() >= 1, "min_scale_patience must be >= 1. Got ", o.min_scale_patience(), ".");
}

}  // namespace

bool plain_pytorch_rule(const GradScalerOptions& o) {
  return o.dynamic() && o.hysteresis() == 1 && o.min_scale() == 0.0 &&
         o.max_scale() == std::numeric_limits<double>::infinity();
}

GradScaler::GradScaler(GradScalerOptions options) : options_(std::move(options)) {
  if (options_.enabled()) validate(options_);
  hysteresis_tracker_ = options_.hysteresis();
}

GradScaler::GradScaler(const GradScaler& other) { *this = other; }

GradScaler& GradScaler::operator=(const GradScaler& other) {
  if (this == &other) return *this;
  options_ = other.options_;
  // torch::Tensor copies share storage; a copied scaler must not update the original's scale.
  scale_ = other.scale_.defined() ? other.scale_.clone() : torch::Tensor();
  growth_tracker_ = other.growth_tracker_.defined() ? other.growth_tracker_.clone() : torch::Tensor();
  init_growth_tracker_ = other.init_growth_tracker_;
  scale_at_least_ = other.scale_at_least_;
  per_optimizer_states_.clear();
  for (const auto& [opt, st] : other.per_optimizer_states_) {
    PerOptimizerState copy;
    copy.stage = st.stage;
    copy.fused = st.fused;
    for (const auto& [dev, f] : st.found_inf_per_device) copy.found_inf_per_device.emplace(dev, f.clone());
    per_optimizer_states_.emplace(opt, std::move(copy));
  }
  found_inf_hook_ = other.found_inf_hook_;
  const auto clone = [](const torch::Tensor& t) { return t.defined() ? t.clone() : torch::Tensor(); };
  const OnDeviceCounts& d = other.on_device_;
  on_device_ = {clone(d.consecutive_overflows), clone(d.hysteresis_tracker), clone(d.floor_overflows),
                clone(d.device_updates)};
  ledger_ = other.ledger_.clone();
  hysteresis_tracker_ = other.hysteresis_tracker_;
  min_scale_overflows_ = other.min_scale_overflows_;
  consecutive_overflows_ = other.consecutive_overflows_;
  overflowed_params_ = other.overflowed_params_;  // the same parameters (not copies of them)
  iteration_closed_ = other.iteration_closed_;
  scaled_since_update_ = other.scaled_since_update_;
  return *this;
}

void GradScaler::check_scale_growth_tracker(const char* funcname) const {
  const char* fix = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration.";
  TORCH_CHECK(scale_.defined(), "Attempted ", funcname, " but _scale is None.  ", fix);
  TORCH_CHECK(growth_tracker_.defined(), "Attempted ", funcname, " but _growth_tracker is None.  ", fix);
}

void GradScaler::lazy_init_scale_growth_tracker(const torch::Device& device) {
  TORCH_INTERNAL_ASSERT(!growth_tracker_.defined(), "_growth_tracker initialized before _scale");
  scale_ = torch::full({}, options_.init_scale(), torch::dtype(torch::kFloat).device(device));
  scale_at_least_ = options_.init_scale();
  growth_tracker_ = torch::full({}, init_growth_tracker_, torch::dtype(torch::kInt).device(device));
}

GradScaler::PerOptimizerState& GradScaler::state_of(const torch::optim::Optimizer& optimizer) {
  return per_optimizer_states_[&optimizer];
}

OptState GradScaler::stage(const torch::optim::Optimizer& optimizer) const {
  auto it = per_optimizer_states_.find(&optimizer);
  return it == per_optimizer_states_.end() ? OptState::kReady : it->second.stage;
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) {
  if (!is_enabled()) return outputs;
  TORCH_CHECK(outputs.defined(), "GradScaler::scale: outputs must be a defined tensor (e.g. the loss).");
  if (!scale_.defined()) lazy_init_scale_growth_tracker(outputs.device());
  const torch::Tensor s = scale_.device() == outputs.device() ? scale_ : scale_.to(outputs.device());
  // Deliberately unlike PyTorch 2.x, whose 0-dim scale does not promote, so that an fp16 loss of 1.5
  // times 2^16 is a Half inf: a bf16/fp16 output is scaled in float32 and returned as float32, as
  // PyTorch 1.13's (1,)-shaped scale did by type promotion. Backward casts the gradient back.
  const bool low_precision = outputs.scalar_type() == torch::kHalf || outputs.scalar_type() == torch::kBFloat16;
  torch::Tensor scaled = (low_precision ? outputs.to(torch::kFloat) : outputs) * s;  // out of place, as PyTorch
  scaled = scaling::compat::scaled_output_shape(scaled);
  if (scaled.requires_grad()) warn_if_backward_under_autocast(scaled);
  scaled_since_update_ = true;
  return scaled;
}

std::vector<torch::Tensor> GradScaler::scale(const std::vector<torch::Tensor>& outputs) {
  std::vector<torch::Tensor> out;
  out.reserve(outputs.size());
  for (const auto& t : outputs) out.push_back(scale(t));
  return out;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) return;
  check_scale_growth_tracker("unscale_");
  PerOptimizerState& st = state_of(optimizer);
  TORCH_CHECK(st.stage != OptState::kUnscaled,
              "unscale_() has already been called on this optimizer since the last update(). "
              "Call unscale_(optimizer) at most once per iteration, before step(optimizer) and update().");
  TORCH_CHECK(st.stage != OptState::kStepped,
              "unscale_() is being called after step(). "
              "Call unscale_(optimizer) before step(optimizer) (step() unscales by itself when needed).");
  if (iteration_closed_) overflowed_params_.clear();  // the first unscale_ of a new iteration
  iteration_closed_ = false;

  // Reciprocal in double on purpose (as PyTorch): 1/scale is exact for powers of two either way, and
  // closer for others.
  const torch::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);

  // Every device gets its own found_inf, as PyTorch's _MultiDeviceReplicator does.
  st.found_inf_per_device.clear();
  std::vector<uint8_t> non_finite;
  for (auto& [dev, d] : scaling::detail::grads_by_device(optimizer, options_.allow_fp16_grads())) {
    const torch::Device device(dev);
    torch::Tensor f = torch::zeros({}, scale_.options().device(device));
    const torch::Tensor inv = device == scale_.device() ? inv_scale : inv_scale.to(device);
    if (!device.is_cpu()) {  // attributing needs a host read there: overflowed_params() stays empty
      // A graph's replays back off without the host seeing it: a captured unscale makes both passes.
      const bool at_most_one = scale_at_least_ >= 1.0 && !scaling::detail::capturing_a_graph();
      numerics::non_finite_check_and_unscale_(d.grads, f, inv, at_most_one);
    } else {
      numerics::non_finite_check_and_unscale_(d.grads, f, inv, non_finite);
      for (size_t i = 0; i < non_finite.size(); ++i)
        if (non_finite[i]) overflowed_params_.push_back(d.params[i]);
    }
    st.found_inf_per_device.emplace(dev, f);
  }

  reduce_found_inf_with_hook(st);
  st.stage = OptState::kUnscaled;
}

// The optimizer's per-device flags added up where the scale lives: the one flag itself when there is one
// there (no kernel), else a new tensor. No flag is changed.
torch::Tensor GradScaler::found_inf_sum(const PerOptimizerState& st) const {
  if (st.found_inf_per_device.size() == 1 && st.found_inf_per_device.begin()->second.device() == scale_.device())
    return st.found_inf_per_device.begin()->second;
  torch::Tensor sum = torch::zeros({}, scale_.options());
  for (const auto& [dev, f] : st.found_inf_per_device) sum += f.to(scale_.device());
  return sum;
}

void GradScaler::reduce_found_inf_with_hook(PerOptimizerState& st) {
  if (!found_inf_hook_) return;
  // One combined flag per optimizer, reduced across processes. Called even when this process has no
  // grads for the optimizer, so that collective calls match on every rank.
  torch::Tensor combined = found_inf_sum(st);
  found_inf_hook_(combined);
  st.found_inf_per_device.clear();
  st.found_inf_per_device.emplace(scale_.device().str(), combined);
}

std::vector<std::string> overflowed_parameter_names(const GradScaler& scaler, const torch::nn::Module& module) {
  std::vector<std::string> names;
  const auto named = module.named_parameters(/*recurse=*/true);  // built once, not per parameter
  for (const auto& param : scaler.overflowed_params()) {
    for (const auto& item : named) {
      if (item.value().unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) {
        names.push_back(item.key());
        break;
      }
    }
  }
  return names;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer, torch::optim::Optimizer::LossClosure closure) {
  if (!is_enabled()) {
    optimizer.step(std::move(closure));
    ledger_.record(false);
    return true;
  }
  TORCH_CHECK(!closure,
              "Closure use is not currently supported if GradScaler is enabled. "
              "Compute the loss and call backward() on scaler.scale(loss) before step(optimizer).");
  check_scale_growth_tracker("step");
  // PyTorch checks only that scale() ever ran; a step whose iteration scaled no loss takes the gradients of
  // an unscaled backward (a GAN's g_loss.backward() instead of scaler.scale(g_loss).backward()).
  TORCH_CHECK(scaled_since_update_,
              "GradScaler::step: no loss was scaled since the last update(), so this optimizer's gradients come "
              "from an unscaled backward. Call scaler.scale(loss).backward() for every loss whose gradients a step "
              "through the scaler takes, and update() once per iteration, after the steps");
  TORCH_CHECK(state_of(optimizer).stage != OptState::kStepped,
              "step() has already been called since the last update(). "
              "Call update() once per iteration, after step() of every optimizer.");
  if (auto* fused = dynamic_cast<GradScaleAwareOptimizer*>(&optimizer)) return step_fused(optimizer, *fused);
  if (state_of(optimizer).stage == OptState::kReady) unscale_(optimizer);

  PerOptimizerState& st = state_of(optimizer);
  TORCH_CHECK(!st.found_inf_per_device.empty(),
              "No inf checks were recorded for this optimizer. None of its parameters has a gradient: call "
              "scaler.scale(loss).backward() before step(optimizer), and check that the optimizer holds the "
              "model's parameters.");
  double found = 0.0;  // PyTorch 1.13: step if the sum over devices is zero
  for (auto& [dev, f] : st.found_inf_per_device) found += f.item<double>();
  const bool do_step = found == 0.0;
  if (do_step) optimizer.step();
  ledger_.record(!do_step);
  st.stage = OptState::kStepped;
  return do_step;
}

void GradScaler::update(double new_scale) {
  if (!is_enabled()) return;
  check_scale_growth_tracker("update");
  TORCH_CHECK(std::isfinite(new_scale) && new_scale >= kMinLossScale,
              "update(new_scale): new_scale must be finite and >= 2^-126 (kMinLossScale). Got ", new_scale,
              "; a zero, subnormal or non-finite scale turns finite gradients into inf/NaN when unscaled.");
  scale_.fill_(new_scale);
  scale_at_least_ = new_scale;
  per_optimizer_states_.clear();
  scaled_since_update_ = false;
}

void GradScaler::update() {
  if (!is_enabled()) return;
  check_scale_growth_tracker("update");

  std::vector<torch::Tensor> found_infs;
  bool all_fused = true;
  for (auto& [opt, st] : per_optimizer_states_) {
    for (auto& [dev, f] : st.found_inf_per_device) found_infs.push_back(f.to(scale_.device()));
    all_fused = all_fused && st.fused;
  }
  TORCH_CHECK(!found_infs.empty(),
              "No inf checks were recorded prior to update. Call step(optimizer) (or unscale_(optimizer)) "
              "for at least one optimizer whose parameters have gradients before update().");
  // Reset now: whatever happens below (including the min-scale error), the next iteration starts clean.
  per_optimizer_states_.clear();
  iteration_closed_ = true;  // overflowed_params() stays readable until the next unscale_
  scaled_since_update_ = false;
  // Read only below (the rules change no flag): one optimizer's flag is used as it is.
  torch::Tensor found_inf_combined = found_infs[0];
  for (size_t i = 1; i < found_infs.size(); ++i) found_inf_combined = found_inf_combined + found_infs[i];

  if (update_on_device(found_inf_combined, all_fused)) return;
  update_on_host(found_inf_combined);
  // The device's counts go on from the host's if a fused step or a device update comes next.
  if (on_device_.consecutive_overflows.defined()) {
    on_device_.consecutive_overflows.fill_(consecutive_overflows_);
    on_device_.hysteresis_tracker.fill_(hysteresis_tracker_);
    on_device_.floor_overflows.fill_(min_scale_overflows_);
  }
}

void GradScaler::update_on_host(const torch::Tensor& found_inf_combined) {
  fold_on_device_counts();
  // One host read of the flag (step() has already made one; free on CPU).
  const bool found = found_inf_combined.item<float>() != 0.0f;
  consecutive_overflows_ = found ? consecutive_overflows_ + 1 : 0;
  if (!found) min_scale_overflows_ = 0;  // they count in a row (PyTorch's kernel path below ignores them)
  if (!options_.dynamic()) return;       // static loss scale: never changes
  // ATen's kernel is PyTorch's rule exactly, as long as the backoff stays above kMinLossScale.
  if (plain_pytorch_rule(options_) &&
      !(found && static_cast<float>(scale_.item<float>() * options_.backoff_factor()) < kMinLossScale)) {
    numerics::amp_update_scale_(scale_, growth_tracker_, found_inf_combined, options_.growth_factor(),
                                options_.backoff_factor(), options_.growth_interval());
    if (found) scale_at_least_ *= options_.backoff_factor();
    return;
  }
  apply_policy_rule(found);
}

// The host-side rule: ampp's policies, and the floor. Same products as ATen: double, stored as float.
void GradScaler::apply_policy_rule(bool found) {
  const double scale = scale_.item<float>();
  const int64_t tracker = growth_tracker_.item<int32_t>();
  double next = scale;
  int64_t next_tracker = 0;
  if (found) {
    // Any overflow restarts the growth window; only the hysteresis-th one in a row backs off.
    if (hysteresis_tracker_ > 1) {
      --hysteresis_tracker_;
    } else if (scale <= floor_scale()) {
      overflow_at_floor(scale);
    } else {
      next = std::max(static_cast<double>(static_cast<float>(scale * options_.backoff_factor())), floor_scale());
    }
  } else {
    min_scale_overflows_ = 0;
    if (options_.consecutive_hysteresis()) hysteresis_tracker_ = options_.hysteresis();
    if (tracker + 1 == options_.growth_interval()) {
      next = std::min(static_cast<double>(static_cast<float>(scale * options_.growth_factor())), options_.max_scale());
      hysteresis_tracker_ = options_.hysteresis();
    } else {
      next_tracker = tracker + 1;
    }
  }
  scale_.fill_(next);
  scale_at_least_ = next;
  growth_tracker_.fill_(next_tracker);
}

// An overflow that found the scale at its floor: the gradients are inf/NaN at any scale.
void GradScaler::overflow_at_floor(double scale) {
  ++min_scale_overflows_;
  if (min_scale_overflows_ < options_.min_scale_patience() || options_.at_min_scale() == MinScaleAction::kIgnore) {
    return;
  }
  const bool user_floor = options_.min_scale() >= kMinLossScale;
  const auto msg = c10::str(
      "Current loss scale already at minimum - cannot decrease scale anymore. The scale is at ",
      user_floor ? "min_scale = "
                 : "2^-126 (kMinLossScale, float32's smallest normal number; below it 1/scale "
                   "overflows and finite gradients would unscale to inf/NaN) = ",
      scale, ", the gradients overflowed in ", consecutive_overflows_, " update(s) in a row and ", min_scale_overflows_,
      " consecutive update(s) at the floor still found inf/NaN gradients (those steps were skipped; no weight "
      "changed). Gradients that overflow at such a scale are inf/NaN by themselves: likely a learning rate or data "
      "problem, not a loss-scale problem. Lower the learning rate, check the inputs for inf/NaN, run numerically "
      "unstable ops in fp32 (or use bf16 instead of fp16); to keep skipping instead, use "
      "GradScalerOptions().at_min_scale(MinScaleAction::kWarn) or raise min_scale_patience.");
  if (options_.at_min_scale() == MinScaleAction::kError) {
    growth_tracker_.fill_(0);  // the update is complete and consistent: the next iteration may proceed
    TORCH_CHECK(false, msg);
  }
  if (min_scale_overflows_ == options_.min_scale_patience()) TORCH_WARN(msg);
}

int64_t GradScaler::hysteresis_tracker() const {
  fold_on_device_counts();
  return hysteresis_tracker_;
}

double GradScaler::get_scale() const {
  if (!is_enabled()) return 1.0;
  if (!scale_.defined()) return options_.init_scale();
  scale_at_least_ = scale_.item<float>();
  return scale_at_least_;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!is_enabled()) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int32_t>() : init_growth_tracker_;
}

StateDict GradScaler::state_dict() const {
  StateDict sd = make_state_dict();
  if (!is_enabled()) return sd;
  sd.insert("scale", get_scale());
  sd.insert("growth_factor", options_.growth_factor());
  sd.insert("backoff_factor", options_.backoff_factor());
  sd.insert("growth_interval", options_.growth_interval());
  sd.insert("_growth_tracker", get_growth_tracker());
  sd.insert("_ampp_hysteresis_tracker", hysteresis_tracker_);
  sd.insert("_ampp_skipped_steps", skipped_steps());  // a read of the ledger
  sd.insert("_ampp_min_scale_overflows", min_scale_overflows_);
  return sd;
}

double state_number(const c10::IValue& v, const char* key) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().to(torch::kCPU).item<double>();
  TORCH_CHECK(false, "GradScaler::load_state_dict: \"", key, "\" must be a number, got ", v.tagKind(),
              "; pass a dict produced by GradScaler::state_dict() or PyTorch's GradScaler.state_dict().");
}

int64_t state_count(const c10::IValue& v, const char* key) {
  const double x = state_number(v, key);
  TORCH_CHECK(x >= 0 && x <= 9.0e15 && x == std::floor(x), "GradScaler::load_state_dict: \"", key,
              "\" must be a whole number >= 0, got ", x, ".");
  return static_cast<int64_t>(x);
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!is_enabled()) return;
  TORCH_CHECK(!state.empty(),
              "The source state dict is empty, possibly because it was saved from a disabled instance of "
              "GradScaler.");
  auto required = [&](const char* key) {
    TORCH_CHECK(state.contains(key), "GradScaler::load_state_dict: key \"", key,
                "\" is missing; pass a dict produced by GradScaler::state_dict().");
    return state.at(key);
  };
  auto count = [&](const char* key, int64_t fallback) {
    return state.contains(key) ? state_count(state.at(key), key) : fallback;
  };
  const double scale = state_number(required("scale"), "scale");
  TORCH_CHECK(std::isfinite(scale) && scale >= kMinLossScale, "GradScaler::load_state_dict: the saved scale ", scale,
              " is not finite or below 2^-126 (kMinLossScale), so the run it came from had already failed (its "
              "gradients overflowed at every scale). Start from an earlier checkpoint, or call update(new_scale).");
  GradScalerOptions loaded = options_;
  loaded.init_scale(scale);
  loaded.growth_factor(state_number(required("growth_factor"), "growth_factor"));
  loaded.backoff_factor(state_number(required("backoff_factor"), "backoff_factor"));
  loaded.growth_interval(state_count(required("growth_interval"), "growth_interval"));
  validate(loaded);  // a saved factor of 0 or NaN would otherwise zero or poison the scale
  options_ = loaded;
  init_growth_tracker_ = state_count(required("_growth_tracker"), "_growth_tracker");
  if (scale_.defined()) scale_.fill_(options_.init_scale());
  scale_at_least_ = options_.init_scale();
  if (growth_tracker_.defined()) growth_tracker_.fill_(init_growth_tracker_);
  // ampp extras are optional, so a state dict written from PyTorch's keys alone loads too.
  fold_on_device_counts();  // the loaded counts replace what the device held too
  hysteresis_tracker_ = count("_ampp_hysteresis_tracker", hysteresis_tracker_);
  ledger_.restore(ledger_.taken(), count("_ampp_skipped_steps", ledger_.skipped()));
  min_scale_overflows_ = count("_ampp_min_scale_overflows", min_scale_overflows_);
  if (on_device_.consecutive_overflows.defined()) {
    on_device_.hysteresis_tracker.fill_(hysteresis_tracker_);
    on_device_.floor_overflows.fill_(min_scale_overflows_);
  }
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  for (const auto& item : state_dict()) archive.write(item.key(), item.value());
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  if (!is_enabled()) return;
  StateDict sd = make_state_dict();
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker",
                          "_ampp_hysteresis_tracker", "_ampp_skipped_steps", "_ampp_min_scale_overflows"}) {
    c10::IValue v;
    if (archive.try_read(key, v)) sd.insert(key, v);
  }
  load_state_dict(sd);
}

}  // namespace ampp
