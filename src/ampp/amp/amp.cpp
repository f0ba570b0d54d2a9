// ampp::Amp: step (skip on overflow, masters -> model), zero_grad, forward casts, state dicts.
#include "state.h"

#include <ampp/precision/rounding.h>
#include <ampp/scaling/fused_optimizers.h>

#include <fmt/core.h>

#include <unordered_set>

namespace ampp {
namespace {

using detail::AmpState;
using detail::OptimizerRecord;

bool is_floating(const torch::Tensor& t) { return t.defined() && t.is_floating_point(); }

}  // namespace

// Masters -> low-precision model (apex's multi_tensor_scale with scale 1.0): a rounding copy.
void detail::copy_masters_to_model(const AmpState& st, const OptimizerRecord& rec) {
  torch::NoGradGuard no_grad;
  for (const auto& slot : rec.slots) {
    if (!slot.model.defined()) continue;
    if (st.emulate_fp16) {
      slot.model.copy_(slot.param.to(torch::kHalf));  // round to fp16, widen exactly: 2 passes, not 3
    } else {
      slot.model.copy_(slot.param);  // copy_ rounds to nearest even into bf16/fp16
    }
  }
}

Amp::Amp(std::shared_ptr<detail::AmpState> state) : state_(std::move(state)) {}

bool detail::skip_decided_on_host(const OptimizerRecord& rec) {
  return rec.skip_flag.defined() && rec.skip_flag.item<float>() != 0.0F;
}

namespace {

// apex's skip_step: drop the (inf/NaN) gradients, leave parameters and optimizer state alone.
void skip_on_host(OptimizerRecord& rec) {
  for (auto& slot : rec.slots) slot.param.mutable_grad() = torch::Tensor();
}

// A fused optimizer (ampp::FusedSGD, FusedAdamW) takes the skip flag and leaves every tensor untouched
// where it is set: the decision stays on the device (and the ledger records it there).
void step_skipping_on_device(OptimizerRecord& rec, GradScaleAwareOptimizer& fused) {
  fused.set_grad_scaling(torch::Tensor(), rec.skip_flag);  // the gradients are unscaled already
  rec.optimizer->step();
  rec.skipped_on_device = rec.skip_flag;
}

// Emulated pure fp16 (O3): the cast parameters hold only fp16 values, so every update of `rec`'s is rounded
// back (those kept FP32, e.g. BatchNorm's with keep_batchnorm_fp32, are not).
void round_cast_params_to_fp16(const AmpState& st, const OptimizerRecord& rec) {
  torch::NoGradGuard no_grad;
  std::unordered_set<const c10::TensorImpl*> stepped;
  for (const auto& slot : rec.slots) stepped.insert(slot.param.unsafeGetTensorImpl());
  for (const auto& t : st.cast_params)
    if (stepped.count(t.unsafeGetTensorImpl())) t.copy_(t.to(torch::kHalf));  // = round_to_fp16, one pass fewer
}

// One optimizer's step: skipped where its gradients overflowed (on the host, or on the device by a fused
// optimizer), the masters copied into the model under O2. Adds its skip flag to `skipped`; false if skipped
// on the host.
bool step_record(AmpState& st, OptimizerRecord& rec, torch::Tensor& skipped) {
  detail::fill_pending_zero_grads(rec);  // zero_grad() then step() without a backward: LibTorch would step zeros
  TORCH_CHECK(!rec.has_scaled_grads,
              "Amp::step(): the gradients are still scaled because the last backward used "
              "delay_unscale(true). Run the last micro-batch's scale_loss(...).backward() without delay_unscale "
              "before step().");
  auto* fused = rec.skip_flag.defined() ? dynamic_cast<GradScaleAwareOptimizer*>(rec.optimizer) : nullptr;
  if (rec.skip_flag.defined()) skipped = skipped.defined() ? skipped + rec.skip_flag : rec.skip_flag;
  if (!fused && detail::skip_decided_on_host(rec)) {
    skip_on_host(rec);
    rec.skip_flag = torch::Tensor();
    return false;
  }
  {
    // apex runs optimizer.step() with its casts disabled; autocast must not touch the update.
    ampp::autocast no_autocast(st.device_type, st.low_dtype, /*enabled=*/false);
    if (fused)
      step_skipping_on_device(rec, *fused);
    else
      rec.optimizer->step();
  }
  rec.skip_flag = torch::Tensor();
  detail::Stopwatch timer(st.props.profile(), &st.profile.copy_seconds);
  if (st.use_masters) {
    // After a skip on the device the masters are unchanged, and copying them again changes nothing.
    if (!rec.sharded) detail::copy_masters_to_model(st, rec);  // a sharded one did it inside its step
    for (auto& slot : rec.slots) {
      if (slot.model.defined()) slot.param.mutable_grad() = torch::Tensor();  // as apex: masters' grads dropped
    }
  }
  if (st.emulate_fp16 && st.model_cast_low && !st.use_masters) round_cast_params_to_fp16(st, rec);
  return true;
}

// A step() call into the ledger: the sum of its optimizers' skip flags, where they are (no host read), or
// "taken" where no flag was set (nothing checked the gradients).
void record_step(AmpState& st, const torch::Tensor& skipped) {
  if (skipped.defined())
    st.ledger.record(skipped);
  else
    st.ledger.record(false);
  ++st.profile.steps;
}

// Amp::step() over several optimizers where one got no gradient since its last step and another did: a GAN
// stepping both after the discriminator's backward, which would change the generator's weights between its
// forward and its backward (LibTorch's "modified by an inplace operation"). The fix: step(optimizer).
void check_every_optimizer_has_gradients(const AmpState& st) {
  if (st.optimizers.size() < 2) return;
  std::vector<size_t> without;
  for (size_t i = 0; i < st.optimizers.size(); ++i)
    if (!detail::has_gradients(st.optimizers[i]) && !st.optimizers[i].has_scaled_grads) without.push_back(i + 1);
  if (without.empty() || without.size() == st.optimizers.size()) return;
  TORCH_CHECK(false, "Amp::step() steps all ", st.optimizers.size(), " optimizers of this handle, and optimizer ",
              c10::Join(", ", without),
              " (in initialize()'s order) got no gradients since its last step while the "
              "others did. With several models (a GAN), step each optimizer when its own backward is done: "
              "amp.step(optimizer), as apex steps each optimizer.step(); stepping it now would change its model's "
              "weights between that model's forward and backward");
}

}  // namespace

bool Amp::step() {
  AmpState& st = *state_;
  check_every_optimizer_has_gradients(st);
  bool all_stepped = true;
  torch::Tensor skipped;  // the records' flags, summed where they are
  for (auto& rec : st.optimizers) all_stepped = step_record(st, rec, skipped) && all_stepped;
  record_step(st, skipped);
  return all_stepped;
}

bool Amp::step_unless(const torch::Tensor& skip) {
  TORCH_CHECK(skip.defined() && skip.numel() == 1,
              "Amp::step_unless: the flag must be one value (float32, 0-dim, "
              "non-zero: skip), e.g. the found-inf flag of numerics::non_finite_check_and_unscale_");
  for (auto& rec : state_->optimizers) rec.skip_flag = rec.skip_flag.defined() ? rec.skip_flag + skip : skip;
  return step();
}

bool Amp::step(torch::optim::Optimizer& optimizer) {
  AmpState& st = *state_;
  auto* rec = st.records_for({&optimizer}).at(0);
  torch::Tensor skipped;
  const bool stepped = step_record(st, *rec, skipped);
  record_step(st, skipped);
  return stepped;
}

void Amp::zero_grad() {
  AmpState& st = *state_;
  for (auto& rec : st.optimizers) {
    // Same result as optimizer->zero_grad() once the next backward is done (see zero_grads_pending), without
    // writing zeros that the backward would only add to: on a small model, that memset and add were
    // most of ampp's per-step cost.
    for (auto& slot : rec.slots) {
      slot.param.mutable_grad() = torch::Tensor();
      slot.stash = torch::Tensor();
      if (slot.model.defined()) slot.model.mutable_grad() = torch::Tensor();
    }
    rec.zero_grads_pending = true;
    rec.has_scaled_grads = false;
    rec.skipped_on_device = torch::Tensor();
  }
  // Cast parameters that no optimizer holds must not accumulate scaled grads forever.
  if (st.use_masters) {
    for (auto& t : st.cast_params) t.mutable_grad() = torch::Tensor();
  }
}

ampp::autocast Amp::autocast() const {
  const AmpState& st = *state_;
  const bool active = st.enabled() && (st.props.patch_torch_functions() || st.model_cast_low);
  if (active) return ampp::autocast(st.device_type, st.low_dtype, true);
  // O0, casts to FP32, disabled: leave whatever region the caller is in exactly as it is.
  return ampp::autocast(st.device_type, ampp::autocast_dtype(st.device_type),
                        ampp::is_autocast_enabled(st.device_type));
}

ampp::autocast Amp::forward_region() const {
  if (torch::GradMode::is_enabled()) state_->trained_through_forward = true;
  return autocast();
}

torch::Tensor Amp::cast_input(const torch::Tensor& input) const {
  const AmpState& st = *state_;
  if (!st.enabled() || !st.model_cast_low || !is_floating(input)) return input;
  detail::Stopwatch timer(st.props.profile(), &state_->profile.cast_seconds);
  if (st.emulate_fp16) return precision::round_to_fp16(input.to(torch::kFloat));
  return input.to(*st.cast_type);
}

torch::Tensor Amp::cast_output(const torch::Tensor& output) const {
  const AmpState& st = *state_;
  if (!st.enabled() || !is_floating(output)) return output;
  c10::optional<c10::ScalarType> target = st.props.cast_model_outputs();
  if (!target && (st.model_cast_low || st.props.patch_torch_functions())) target = torch::kFloat;
  if (!target || output.scalar_type() == *target) return output;
  detail::Stopwatch timer(st.props.profile(), &state_->profile.cast_seconds);
  return output.to(*target);
}

std::vector<torch::Tensor> Amp::master_params() const {
  std::vector<torch::Tensor> out;
  for (const auto& rec : state_->optimizers) {
    for (const auto& slot : rec.slots) out.push_back(slot.param);
  }
  return out;
}

std::vector<torch::Tensor> Amp::model_params_of_masters() const {
  std::vector<torch::Tensor> out;
  for (const auto& rec : state_->optimizers) {
    for (const auto& slot : rec.slots) out.push_back(slot.model.defined() ? slot.model : slot.param);
  }
  return out;
}

std::vector<torch::Tensor> Amp::master_gradient_buffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& rec : state_->optimizers) {
    for (const auto& slot : rec.slots)
      if (slot.master_grad_buffer.defined()) out.push_back(slot.master_grad_buffer);
  }
  return out;
}

std::vector<torch::Tensor> Amp::master_params(const torch::optim::Optimizer& optimizer) const {
  for (const auto& rec : state_->optimizers) {
    if (rec.optimizer != &optimizer) continue;
    std::vector<torch::Tensor> out;
    for (const auto& slot : rec.slots) out.push_back(slot.param);
    return out;
  }
  TORCH_CHECK(false, "master_params: this optimizer was not passed to ampp::initialize() for this handle.");
}

bool Amp::was_cast(const torch::Tensor& param) const {
  for (const auto& t : state_->cast_params)
    if (t.is_same(param)) return true;
  return false;
}

void Amp::sync_masters_from_model() {
  torch::NoGradGuard no_grad;
  for (auto& rec : state_->optimizers) {
    for (auto& slot : rec.slots) {
      if (slot.model.defined()) slot.param.copy_(slot.model);
    }
  }
}

StateDict Amp::state_dict() const {
  const AmpState& st = *state_;
  StateDict sd = make_state_dict();
  for (size_t i = 0; i < st.scalers.size(); ++i) {
    c10::impl::GenericDict scaler(c10::StringType::get(), c10::AnyType::get());
    scaler.insert("loss_scale", st.scalers[i]->get_scale());
    scaler.insert("unskipped", st.scalers[i]->get_growth_tracker());
    sd.insert(fmt::format("loss_scaler{}", i), scaler);
  }
  if (st.use_masters) {
    std::vector<torch::Tensor> masters;
    for (const auto& rec : st.optimizers) {
      for (const auto& slot : rec.slots) {
        if (slot.model.defined()) masters.push_back(slot.param.detach());
      }
    }
    sd.insert("master_params", masters);
  }
  return sd;
}

void Amp::load_state_dict(const StateDict& state) {
  AmpState& st = *state_;
  std::vector<std::string> unexpected;
  size_t n_scalers = 0;
  for (const auto& item : state) {
    const std::string& key = item.key();
    if (key.rfind("loss_scaler", 0) == 0) {
      ++n_scalers;
    } else if (key != "master_params") {
      unexpected.push_back(key);
    }
  }
  TORCH_CHECK(unexpected.empty(),
              "Error(s) in loading state_dict. Unexpected key(s) in state_dict: ", c10::Join(", ", unexpected),
              ". Expected \"loss_scaler<i>\" entries (and \"master_params\" under O2).");
  if (n_scalers != st.scalers.size()) {
    TORCH_WARN("Amp::load_state_dict: the state dict has ", n_scalers, " loss scaler(s) while this handle uses ",
               st.scalers.size(), "; loading the first ", std::min(n_scalers, st.scalers.size()), ".");
  }
  for (size_t i = 0; i < std::min(n_scalers, st.scalers.size()); ++i) {
    const std::string key = fmt::format("loss_scaler{}", i);
    auto it = state.find(key);
    TORCH_CHECK(it != state.end() && it->value().isGenericDict(), "Amp::load_state_dict: missing \"", key,
                "\" (a dict with \"loss_scale\" and \"unskipped\").");
    auto entry = it->value().toGenericDict();
    TORCH_CHECK(entry.contains("loss_scale") && entry.contains("unskipped"), "Amp::load_state_dict: \"", key,
                "\" needs the keys \"loss_scale\" and \"unskipped\".");
    StateDict sd = st.scalers[i]->state_dict();
    sd.insert_or_assign("scale", entry.at("loss_scale").toDouble());
    sd.insert_or_assign("_growth_tracker", entry.at("unskipped").toInt());
    st.scalers[i]->load_state_dict(sd);
  }

  torch::NoGradGuard no_grad;
  auto masters_it = state.find("master_params");
  if (masters_it == state.end()) {
    // Masters were not saved (apex-style dict): start them from the model's current weights.
    sync_masters_from_model();
    return;
  }
  TORCH_CHECK(st.use_masters,
              "Amp::load_state_dict: the state dict holds FP32 master weights, but this handle has "
              "none (opt level ",
              to_string(st.props.opt_level()),
              "). Load it into a handle initialized with O2 / "
              "master_weights(true), or drop \"master_params\".");
  const auto masters = masters_it->value().toTensorVector();
  size_t k = 0;
  for (auto& rec : st.optimizers) {
    for (auto& slot : rec.slots) {
      if (!slot.model.defined()) continue;
      TORCH_CHECK(k < masters.size(), "Amp::load_state_dict: the state dict has ", masters.size(),
                  " master weights, fewer than this model's. Was it saved from a different model?");
      TORCH_CHECK(masters[k].sizes() == slot.param.sizes(), "Amp::load_state_dict: master weight ", k, " has shape ",
                  masters[k].sizes(), " but the model's parameter has shape ", slot.param.sizes(),
                  ". Was it saved from a different model?");
      slot.param.copy_(masters[k++]);
    }
    detail::copy_masters_to_model(st, rec);  // model == masters rounded, as after a step
  }
  TORCH_CHECK(k == masters.size(), "Amp::load_state_dict: the state dict has ", masters.size(),
              " master weights but this model has ", k, ". Was it saved from a different model?");
}

double Amp::loss_scale(int64_t loss_id) const { return scaler(loss_id).get_scale(); }

void Amp::set_found_inf_reducer(FoundInfHook reduce) {
  AmpState* raw = state_.get();
  for (auto& scaler : state_->scalers)
    scaler->set_found_inf_hook([raw, reduce](torch::Tensor& found_inf) {
      if (reduce) reduce(found_inf);
      raw->overflow = raw->overflow.defined() ? raw->overflow + found_inf : found_inf;  // what step() skips on
    });
}

const GradScaler& Amp::scaler(int64_t loss_id) const {
  TORCH_CHECK(loss_id >= 0 && loss_id < static_cast<int64_t>(state_->scalers.size()), "loss_id ", loss_id,
              " is out of range: this handle has ", state_->scalers.size(), " loss scaler(s).");
  return *state_->scalers[loss_id];
}

int64_t Amp::skipped_steps() const { return state_->ledger.skipped(); }
const SkipLedger& Amp::ledger() const { return state_->ledger; }
SkipLedger& Amp::ledger() { return state_->ledger; }

bool Amp::checks_overflow() const { return state_->scales_loss; }
bool Amp::step_will_skip() const {
  for (const auto& rec : state_->optimizers)
    if (detail::skip_decided_on_host(rec)) return true;
  return false;
}

const torch::Tensor& Amp::last_step_skipped() const { return state_->ledger.skipped_flag(); }
const Properties& Amp::properties() const { return state_->props; }
c10::ScalarType Amp::model_storage_dtype() const {
  const AmpState& st = *state_;
  if (!st.enabled() || !st.cast_type) return torch::kFloat;
  return st.emulate_fp16 ? torch::kFloat : *st.cast_type;
}
bool Amp::fp16_emulated() const { return state_->emulate_fp16; }
AmpProfile Amp::profile() const { return state_->profile; }

}  // namespace ampp
