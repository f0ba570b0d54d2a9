// scale_loss(loss).backward(): apex's scale_loss with-block, on top of ampp::GradScaler.
//
// Why every backward unscales at once (instead of once per step as with a bare GradScaler): each
// loss_id has its own scale, and the scale may change between two backwards of one step, so scaled
// gradients of different backwards cannot simply be summed. Gradients accumulated earlier (already
// unscaled, in FP32) are set aside before autograd runs, the new ones are unscaled alone, and the
// two are added: grad = new / scale + stashed (apex's axpby).
#include "state.h"

#include <fmt/core.h>

namespace ampp {
namespace {

using detail::AmpState;
using detail::OptimizerRecord;

// Set the already-accumulated gradients aside so the backward's gradients arrive alone. Those a
// fused optimizer skipped on (inf/NaN, left in place) are dropped, as apex's skip drops them: the
// unscale pass checks only the new gradients, so kept ones would reach the weights.
void stash_grads(OptimizerRecord& rec) {
  const bool drop =
      rec.skipped_on_device.defined() && rec.skipped_on_device.item<float>() != 0.0F;  // rare: no zero_grad()
  rec.skipped_on_device = torch::Tensor();
  for (auto& slot : rec.slots) {
    if (drop) slot.param.mutable_grad() = torch::Tensor();
    slot.stash = slot.param.grad();
    if (slot.stash.defined()) slot.param.mutable_grad() = torch::Tensor();
  }
}

// Model grads (low precision, scaled) become the masters' FP32 grads; the model keeps none.
void move_model_grads_to_masters(OptimizerRecord& rec) {
  for (auto& slot : rec.slots) {
    if (!slot.model.defined()) continue;
    torch::Tensor g = slot.model.grad();
    if (!g.defined()) continue;
    // Convert before unscaling: a small fp16 gradient divided by the scale in fp16 would underflow.
    if (g.scalar_type() == torch::kFloat) {
      slot.param.mutable_grad() = g;
    } else {
      torch::Tensor& buffer = slot.master_grad_buffer;
      // Reuse only while nothing else holds it or a view of it (a stash, a user's reference).
      if (!buffer.defined() || buffer.sizes() != g.sizes() || buffer.use_count() > 1 ||
          buffer.storage().use_count() > 1) {
        buffer = torch::empty(g.sizes(), g.options().dtype(torch::kFloat));
      }
      buffer.copy_(g);
      slot.param.mutable_grad() = buffer;
    }
    slot.model.mutable_grad() = torch::Tensor();
  }
}

void add_stash_back(OptimizerRecord& rec) {
  torch::NoGradGuard no_grad;
  detail::fill_pending_zero_grads(rec);
  for (auto& slot : rec.slots) {
    if (!slot.stash.defined()) continue;
    torch::Tensor g = slot.param.grad();
    if (g.defined()) {
      g.add_(slot.stash);
    } else {
      slot.param.mutable_grad() = slot.stash;
    }
    slot.stash = torch::Tensor();
  }
}

}  // namespace

namespace detail {
bool has_gradients(const OptimizerRecord& rec) {
  for (const auto& slot : rec.slots)
    if (slot.param.grad().defined() || (slot.model.defined() && slot.model.grad().defined())) return true;
  return false;
}

void fill_pending_zero_grads(OptimizerRecord& rec) {
  if (!rec.zero_grads_pending) return;
  torch::NoGradGuard no_grad;
  for (auto& slot : rec.slots) {
    if (!slot.param.grad().defined()) slot.param.mutable_grad() = torch::zeros_like(slot.param);
  }
  rec.zero_grads_pending = false;
}
}  // namespace detail

ScaledLoss::ScaledLoss(std::shared_ptr<detail::AmpState> state, torch::Tensor scaled, torch::Tensor scale,
                       ScaleLossOptions options)
    : state_(std::move(state)), scaled_(std::move(scaled)), scale_(std::move(scale)), options_(std::move(options)) {}

double ScaledLoss::scale() const { return scale_.defined() ? scale_.item<double>() : 1.0; }

ScaledLoss Amp::scale_loss(const torch::Tensor& loss, int64_t loss_id) {
  return scale_loss(loss, ScaleLossOptions().loss_id(loss_id));
}

ScaledLoss Amp::scale_loss(const torch::Tensor& loss, torch::optim::Optimizer& optimizer, int64_t loss_id) {
  return scale_loss(loss, ScaleLossOptions().loss_id(loss_id).optimizers({&optimizer}));
}

ScaledLoss Amp::scale_loss(const torch::Tensor& loss, ScaleLossOptions options) {
  AmpState& st = *state_;
  TORCH_CHECK(loss.defined() && loss.numel() == 1, "scale_loss expects a scalar loss (one element)",
              loss.defined() ? c10::str(", got shape ", loss.sizes()) : std::string(", got an undefined tensor"),
              ". Reduce it first, e.g. loss.mean().");
  TORCH_CHECK(options.loss_id() >= 0 && options.loss_id() < st.props.num_losses(), "scale_loss: loss_id ",
              options.loss_id(), " is out of range: initialize() created ", st.props.num_losses(),
              " loss scaler(s). Pass Properties().num_losses(n) to initialize() for n losses.");
  st.records_for(options.optimizers());  // validates the subset early
  // Under O2/O3 a model called directly runs on inputs amp.forward would have cast: in bf16 (and native
  // fp16) LibTorch refuses the float32 input, but with fp16 emulated on the CPU the whole forward runs in
  // float32, silently. One rule for every dtype: a cast model trains through amp.forward.
  TORCH_CHECK(!st.enabled() || !st.model_cast_low || st.trained_through_forward,
              "scale_loss: no forward has gone through amp.forward() since initialize() cast the model to ",
              st.emulate_fp16 ? "fp16 (emulated on the CPU)" : c10::toString(*st.cast_type), " (",
              to_string(st.props.opt_level()),
              "). Call the model as amp.forward(model, input) (or amp.forward(ddp, input)): it casts the inputs "
              "and runs the forward in the opt level's precision; a model called directly computes in float32 "
              "under fp16 emulation, or refuses the float32 input.");
  if (!st.scales_loss) return ScaledLoss(state_, loss.to(torch::kFloat), torch::Tensor(), std::move(options));
  detail::Stopwatch timer(st.props.profile(), &st.profile.scaler_seconds);
  GradScaler& scaler = *st.scalers[options.loss_id()];
  // apex's scaled loss is loss.float() * loss_scale: 0-dim in every version (GradScaler::scale gives
  // shape (1,) on LibTorch 1.13, as torch.cuda.amp's does).
  torch::Tensor scaled = scaler.scale(loss.to(torch::kFloat)).reshape({});
  // A copy, not a read: the backward's update() changes the scale in place, and a read would wait for
  // the GPU before the backward is even queued.
  return ScaledLoss(state_, std::move(scaled), scaler.scale_tensor().clone(), std::move(options));
}

void ScaledLoss::backward(bool retain_graph) {
  AmpState& st = *state_;
  if (!st.scales_loss) {  // O0/O3 defaults and disabled: nothing to unscale
    scaled_.backward({}, retain_graph);
    return;
  }
  const bool prof = st.props.profile();
  auto records = st.records_for(options_.optimizers());
  {
    detail::Stopwatch timer(prof, &st.profile.copy_seconds);
    for (auto* rec : records) {
      if (!rec->has_scaled_grads) stash_grads(*rec);
    }
  }
  scaled_.backward({}, retain_graph);
  if (options_.delay_unscale()) {
    for (auto* rec : records) rec->has_scaled_grads = true;
    return;
  }

  GradScaler& scaler = *st.scalers[options_.loss_id()];
  st.overflow = torch::Tensor();
  bool any_checked = false;
  for (auto* rec : records) {
    {
      detail::Stopwatch timer(prof, &st.profile.copy_seconds);
      move_model_grads_to_masters(*rec);
    }
    if (detail::has_gradients(*rec)) {
      detail::Stopwatch timer(prof, &st.profile.scaler_seconds);
      scaler.unscale_(*rec->optimizer);  // fused unscale + inf/NaN check over the new grads only
      any_checked = true;
    }
    detail::Stopwatch timer(prof, &st.profile.copy_seconds);
    add_stash_back(*rec);
    rec->has_scaled_grads = false;
  }
  if (!any_checked) return;  // the loss reached none of the optimizers' parameters
  {
    detail::Stopwatch timer(prof, &st.profile.scaler_seconds);
    scaler.update();  // apex updates the scale at every scale_loss exit
  }
  // The next step() skips where the flag is set: it stays on the device (Amp::step reads it only for an
  // optimizer that cannot skip by itself).
  for (auto* rec : records) rec->skip_flag = rec->skip_flag.defined() ? rec->skip_flag + st.overflow : st.overflow;
  if (st.props.verbosity() >= 1 && st.overflow.item<float>() != 0.0F) {  // apex's message: a host read
    fmt::print(stderr, "ampp: gradient overflow in loss {}: the next step is skipped, loss scale now {}\n",
               options_.loss_id(), scaler.get_scale());
  }
}

}  // namespace ampp
