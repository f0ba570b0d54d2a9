// ampp::initialize: resolve the properties, cast the model, build FP32 masters, create loss scalers.
#include <ampp/amp/initialize.h>

#include "model_cast.h"
#include "optimizer_state.h"
#include "state.h"

#include <ampp/util/launch_environment.h>
#include <ampp/util/sharded_optimizer.h>

#include <fmt/core.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace ampp {
namespace {

using detail::AmpState;
using detail::OptimizerRecord;
using detail::ParamSlot;

bool is_low(c10::ScalarType t) { return t == c10::kHalf || t == c10::kBFloat16; }

// Can anything run `dtype` on `device`? CUDA has fp16/bf16 kernels; CPU has bf16 kernels and ampp's
// fp16 emulation; nothing else is supported.
void check_runnable(c10::DeviceType device, c10::ScalarType dtype, bool emulate_fp16) {
  const std::string dev = c10::DeviceTypeName(device, /*lower_case=*/true);
  if (device == c10::DeviceType::CUDA) return;
  TORCH_CHECK(device == c10::DeviceType::CPU, "ampp::initialize: ", c10::toString(dtype),
              " was requested for a model on ", dev,
              ", where neither LibTorch kernels nor ampp's emulation can run it (ampp supports CPU and CUDA). "
              "Move the model to CPU or CUDA, or use OptLevel::O0.");
  if (dtype == c10::kHalf) {
    TORCH_CHECK(emulate_fp16,
                "ampp::initialize: fp16 was requested on CPU, where LibTorch 1.13 has no fp16 kernels, "
                "and Properties::emulate_fp16(false) forbids ampp's fp16 emulation, so nothing can run it. Use "
                "Properties::dtype(torch::kBFloat16) (native on CPU), allow the emulation, or train on CUDA.");
  }
}

// apex prints its table in every process; one copy (rank 0's, or an unlaunched process's) says it all.
void print_properties(const detail::AmpState& st) {
  const Properties& p = st.props;
  const auto rank = launch_environment().rank;
  if (!p.enabled() || p.verbosity() < 1 || (rank && *rank != "0")) return;
  fmt::print(stderr, "ampp: optimization level {} ({}{})\n{}", to_string(p.opt_level()),
             c10::DeviceTypeName(st.device_type, true), st.emulate_fp16 ? ", fp16 emulated" : "", p.to_string());
}

GradScalerOptions scaler_options(const Properties& p) {
  GradScalerOptions o;
  o.allow_fp16_grads(true);  // O3 with fp16 on CUDA has fp16 grads; apex only warns about them
  if (p.loss_scale().is_dynamic()) {
    // apex LossScaler: GradScaler's defaults (2^16, x2 after 2000 clean backwards, /2 on overflow), the
    // start capped by max_loss_scale, clamped to [min_loss_scale, max_loss_scale]; at the floor it keeps
    // skipping (no error).
    o.init_scale(std::min(o.init_scale(), p.max_loss_scale()))
        .max_scale(p.max_loss_scale())
        .min_scale(p.min_loss_scale().value_or(0.0))
        .at_min_scale(MinScaleAction::kIgnore);
  } else {
    o.init_scale(p.loss_scale().value()).dynamic(false);
  }
  return o;
}

// O2: replace each low-precision model parameter in `optimizer` by an FP32 master (apex's
// _process_optimizer). FP32 parameters (BatchNorm, extra fp32 tensors) are their own masters.
OptimizerRecord make_record(torch::optim::Optimizer& optimizer, const AmpState& st,
                            const std::unordered_map<const c10::TensorImpl*, torch::Tensor>& cast,
                            const std::unordered_set<const c10::TensorImpl*>& model_params, size_t index,
                            std::unordered_set<const c10::TensorImpl*>& claimed) {
  OptimizerRecord rec;
  rec.optimizer = &optimizer;
  auto* sharded = dynamic_cast<ShardedOptimizer*>(&optimizer);
  rec.sharded = sharded != nullptr && st.use_masters;
  size_t held = 0;
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    auto& params = optimizer.param_groups()[g].params();
    for (auto& p : params) {
      ParamSlot slot;
      slot.param = p;
      const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
      const bool in_model = model_params.count(impl) > 0;
      held += in_model ? 1 : 0;
      const bool is_cast = cast.count(impl) > 0;
      if (st.use_masters) {
        TORCH_CHECK(claimed.insert(impl).second, "ampp::initialize: a parameter of shape ", p.sizes(),
                    " appears in more than one optimizer (or twice in optimizer ", index, "). Under ",
                    to_string(st.props.opt_level()),
                    " each parameter gets one FP32 master, so give every parameter "
                    "to exactly one optimizer.");
        TORCH_CHECK(in_model || !p.is_floating_point() || p.scalar_type() == torch::kFloat,
                    "ampp::initialize: optimizer ", index, " (param group ", g, ") holds a ",
                    c10::toString(p.scalar_type()), " tensor of shape ", p.sizes(),
                    " that is not a parameter of the model passed to initialize(). "
                    "Build the optimizer from that model's parameters (model->parameters()) and pass an FP32 model.");
      }
      const bool needs_master = is_cast && st.use_masters && p.requires_grad();
      // ZeRO: another process steps a parameter of another shard and sends it over; here only its
      // gradient is checked for inf/NaN, so it gets no master.
      if (needs_master && (!sharded || sharded->steps_locally(p))) {
        torch::Tensor master = p.detach().to(torch::kFloat).clone().requires_grad_(true);
        detail::move_param_state(optimizer, p, master);  // state lives with the master, in FP32
        slot.model = p;
        slot.param = master;
        p = master;  // the optimizer now steps the master
        if (sharded) sharded->use_master(slot.model, master);
      } else if (is_cast && !needs_master) {
        detail::cast_param_state(optimizer, p);  // O3: state in the parameter's (low) dtype
      }
      rec.slots.push_back(std::move(slot));
    }
  }
  TORCH_CHECK(!st.use_masters || held > 0 || rec.slots.empty(), "ampp::initialize: optimizer ", index,
              " holds none of the model's parameters. Under ", to_string(st.props.opt_level()),
              " ampp replaces the optimizer's low-precision model parameters by FP32 "
              "master copies, so the optimizer must be built from the same model object passed to initialize() "
              "(torch::optim::SGD opt(model->parameters(), ...)), before initialize() is called.");
  return rec;
}

// A sharded optimizer (ZeRO) sends its shard to the other processes inside its step: the shard's
// masters must reach the model before that, not after the step as for other optimizers.
void copy_masters_before_sharing(const std::shared_ptr<AmpState>& st, ShardedOptimizer& optimizer, size_t index) {
  std::weak_ptr<AmpState> weak = st;
  optimizer.set_after_local_step([weak, index] {
    if (auto state = weak.lock()) detail::copy_masters_to_model(*state, state->optimizers[index]);
  });
}

}  // namespace

std::vector<detail::OptimizerRecord*> detail::AmpState::records_for(
    const std::vector<torch::optim::Optimizer*>& subset) {
  std::vector<OptimizerRecord*> out;
  if (subset.empty()) {
    for (auto& rec : optimizers) out.push_back(&rec);
    return out;
  }
  for (auto* opt : subset) {
    auto it = std::find_if(optimizers.begin(), optimizers.end(),
                           [&](const OptimizerRecord& r) { return r.optimizer == opt; });
    TORCH_CHECK(it != optimizers.end(),
                "ampp: an optimizer given to scale_loss() or step() was not passed to ampp::initialize() for "
                "this handle; give only its optimizers (or, to scale_loss, none: all of them)");
    out.push_back(&*it);
  }
  return out;
}

Amp initialize(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
               const std::vector<torch::optim::Optimizer*>& optimizers, Properties properties) {
  TORCH_CHECK(!models.empty(), "ampp::initialize: pass at least one model.");
  for (const auto& m : models) TORCH_CHECK(m != nullptr, "ampp::initialize: a model is null.");
  std::unordered_set<const torch::optim::Optimizer*> seen;
  for (auto* opt : optimizers) {
    TORCH_CHECK(opt != nullptr, "ampp::initialize: an optimizer is null.");
    TORCH_CHECK(seen.insert(opt).second,
                "ampp::initialize: the same optimizer was passed twice. "
                "A given optimizer should be passed to ampp::initialize exactly once.");
  }

  auto st = std::make_shared<AmpState>();
  st->device_type = detail::model_device_type(models);
  properties.device_type(st->device_type);
  st->props = properties;
  st->models = models;
  st->low_dtype = properties.resolved_dtype();
  const Properties& p = st->props;

  if (p.enabled()) {
    detail::check_model_fp32(models);
    st->cast_type = p.cast_model_type();
    st->model_cast_low = st->cast_type && is_low(*st->cast_type);
    if (st->model_cast_low) st->low_dtype = *st->cast_type;
    if (st->model_cast_low || p.patch_torch_functions()) {
      check_runnable(st->device_type, st->low_dtype, p.emulate_fp16());
    }
    st->emulate_fp16 = st->device_type == c10::DeviceType::CPU && st->low_dtype == c10::kHalf &&
                       (st->model_cast_low || p.patch_torch_functions());
    if (st->model_cast_low) {
      for (const auto& m : models) {
        auto cast = detail::cast_model(*m, *st->cast_type, p.keep_batchnorm_fp32().value_or(false), st->emulate_fp16);
        st->cast_params.insert(st->cast_params.end(), cast.begin(), cast.end());
      }
    }
    st->use_masters = p.master_weights().value_or(false) && !st->cast_params.empty();
  }

  std::unordered_map<const c10::TensorImpl*, torch::Tensor> cast;
  for (const auto& t : st->cast_params) cast.emplace(t.unsafeGetTensorImpl(), t);
  std::unordered_set<const c10::TensorImpl*> model_params;
  for (const auto& m : models) {
    for (const auto& t : m->parameters()) model_params.insert(t.unsafeGetTensorImpl());
  }
  std::unordered_set<const c10::TensorImpl*> claimed;
  for (size_t i = 0; i < optimizers.size(); ++i) {
    st->optimizers.push_back(make_record(*optimizers[i], *st, cast, model_params, i, claimed));
    if (st->optimizers.back().sharded)
      copy_masters_before_sharing(st, dynamic_cast<ShardedOptimizer&>(*optimizers[i]), i);
  }
  if (st->use_masters) {
    size_t orphans = 0;
    for (const auto& t : st->cast_params) orphans += t.requires_grad() && !claimed.count(t.unsafeGetTensorImpl());
    if (orphans > 0 && !optimizers.empty()) {
      TORCH_WARN("ampp::initialize: ", orphans,
                 " trainable model parameter(s) are in no optimizer and will not be "
                 "updated. Give them to an optimizer or set requires_grad(false).");
    }
  }

  // Loss scalers (always created, so state_dict() has apex's keys at every level).
  for (int64_t i = 0; i < p.num_losses(); ++i) {
    st->scalers.push_back(std::make_unique<GradScaler>(scaler_options(p)));
  }
  const bool unit_static = !p.loss_scale().is_dynamic() && p.loss_scale().value() == 1.0;
  st->scales_loss = p.enabled() && (st->use_masters || !unit_static);

  print_properties(*st);
  Amp amp(st);
  amp.set_found_inf_reducer(nullptr);  // observes the overflow flag GradScaler computes in its fused unscale pass
  return amp;
}

Amp initialize(const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
               Properties properties) {
  return initialize(std::vector<std::shared_ptr<torch::nn::Module>>{model},
                    std::vector<torch::optim::Optimizer*>{&optimizer}, std::move(properties));
}

Amp initialize(const std::shared_ptr<torch::nn::Module>& model, Properties properties) {
  return initialize(std::vector<std::shared_ptr<torch::nn::Module>>{model}, {}, std::move(properties));
}

}  // namespace ampp
