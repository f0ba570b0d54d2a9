// fp8 products with delayed scaling (float8_delayed.h): TransformerEngine's DelayedScaling formula, on
// the products of the tensorwise recipe.
#include <ampp/precision/float8_delayed.h>
#include <ampp/precision/float8_ranges.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>

#include "float8_kernels.h"
#include "torch_compat.h"

namespace ampp {

namespace float8_delayed_impl {
constexpr int64_t kColumns = 3;  // x, weight, gradient
}

Float8DelayedState make_float8_delayed_state(int64_t amax_history_len, const torch::Device& device) {
  TORCH_CHECK(amax_history_len >= 1, "ampp::Float8LinearConfig::amax_history_len must be at least 1, got ",
              amax_history_len);
  const auto f32 = torch::dtype(torch::kFloat).device(device);
  return {torch::zeros({amax_history_len, float8_delayed_impl::kColumns}, f32),
          torch::ones({float8_delayed_impl::kColumns}, f32)};
}

#if AMPP_HAS_FLOAT8
namespace float8_delayed_impl {

void check_state(const Float8DelayedState& state, const torch::Tensor& weight) {
  const auto& h = state.amax_history;
  TORCH_CHECK(h.defined() && h.dim() == 2 && h.size(0) >= 1 && h.size(1) == kColumns && state.scale.defined() &&
                  state.scale.sizes() == torch::IntArrayRef{kColumns},
              "ampp::float8_delayed_linear: the state is an amax history [len, 3] and scales [3] "
              "(make_float8_delayed_state), got ",
              h.defined() ? h.sizes() : torch::IntArrayRef{}, " and ",
              state.scale.defined() ? state.scale.sizes() : torch::IntArrayRef{});
  TORCH_CHECK(h.scalar_type() == torch::kFloat && state.scale.scalar_type() == torch::kFloat,
              "ampp::float8_delayed_linear: the amax history and scales must stay float32, got ", h.scalar_type(),
              " (a module->to(dtype) casts them; ampp::initialize's casts keep them float32)");
  TORCH_CHECK(h.device() == weight.device() && state.scale.device() == weight.device(),
              "ampp::float8_delayed_linear: the state is on ", h.device(), ", the weight on ", weight.device());
}

// The scales the history gives (history [len, n], current scales [n]), TransformerEngine's formula.
torch::Tensor scales_from_history(const torch::Tensor& history, const torch::Tensor& scale, c10::ScalarType type,
                                  const Float8LinearConfig& config) {
  const auto amax = config.amax_compute_algo() == Float8AmaxCompute::kMax ? history.amax(0) : history[0];
  // In float32, as TE: the largest value after scaling, then one division.
  const float scaled_max = static_cast<float>(float8_max(type)) * std::pow(2.0F, -static_cast<float>(config.margin()));
  auto next = torch::full_like(amax, scaled_max) / amax;
  next = torch::where(torch::isfinite(amax) & (amax > 0), next, scale);
  return torch::where(torch::isinf(next), torch::full_like(next, std::numeric_limits<float>::max()), next);
}

// Folds columns [first, first + n) of the history in; returns their scales for this pass.
torch::Tensor fold(const Float8DelayedState& state, int64_t first, int64_t n, c10::ScalarType type,
                   const Float8LinearConfig& config, bool record) {
  auto history = state.amax_history.narrow(1, first, n);
  auto scale = state.scale.narrow(0, first, n);
  auto next = scales_from_history(history, scale, type, config);
  if (!record) return next;
  scale.copy_(next);
  history.copy_(history.roll(-1, 0));  // row i <- row i + 1, the last row <- row 0
  history[0].zero_();                  // the oldest entry (row 1 before) is gone
  return next;
}

void record_amax(const Float8DelayedState& state, int64_t column, const torch::Tensor& t) {
  state.amax_history[0][column].copy_(t.abs().max().to(torch::kFloat));
}

detail::Float8Operand cast(const torch::Tensor& t, const torch::Tensor& scale, c10::ScalarType type) {
  return {to_float8(t, scale, type), scale};
}

struct Pass {
  Float8DelayedState state;
  Float8LinearConfig config;
  bool record;
  std::string layer;  // the fp8 doctor's name for it
  bool measure;       // a pass the fp8 doctor measures (gradients enabled)
};

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// out = x @ W^T on float8 operands, as the tensorwise recipe's, with the scales of the delayed state.
struct DelayedFloat8Matmul : torch::autograd::Function<DelayedFloat8Matmul> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const Pass& pass, int64_t out_dtype) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto scales = fold(pass.state, 0, 2, torch::kFloat8_e4m3fn, pass.config, pass.record);
    const auto x8 = cast(x, scales[0], torch::kFloat8_e4m3fn);
    const auto w8 = cast(weight.t(), scales[1], torch::kFloat8_e4m3fn);
    if (pass.record) record_amax(pass.state, 0, x), record_amax(pass.state, 1, weight);
    if (pass.measure) {
      detail::record_float8_cast(pass.layer, "input", x, x8.scale, x8.data);
      detail::record_float8_cast(pass.layer, "weight", weight.t(), w8.scale, w8.data);
    }
    ctx->save_for_backward({x, weight, scales});
    ctx->saved_data["history"] = pass.state.amax_history;
    ctx->saved_data["scale"] = pass.state.scale;
    ctx->saved_data["algo"] = static_cast<int64_t>(pass.config.amax_compute_algo());
    ctx->saved_data["margin"] = pass.config.margin();
    ctx->saved_data["record"] = pass.record;
    ctx->saved_data["layer"] = pass.layer;
    return detail::float8_scaled_mm(x8, w8, static_cast<c10::ScalarType>(out_dtype), /*fast_accum=*/true);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &scales = saved[2];
    const auto& g = grads[0];
    const Pass pass{{ctx->saved_data["history"].toTensor(), ctx->saved_data["scale"].toTensor()},
                    Float8LinearConfig()
                        .amax_compute_algo(static_cast<Float8AmaxCompute>(ctx->saved_data["algo"].toInt()))
                        .margin(ctx->saved_data["margin"].toInt()),
                    ctx->saved_data["record"].toBool(),
                    ctx->saved_data["layer"].toStringRef(),
                    true};
    const auto g_scale = fold(pass.state, 2, 1, torch::kFloat8_e5m2, pass.config, pass.record)[0];
    const auto g8 = cast(g, g_scale, torch::kFloat8_e5m2);
    if (pass.record) record_amax(pass.state, 2, g);
    detail::record_float8_cast(pass.layer, "gradient", g, g8.scale, g8.data);
    // The weight and x cast as in the forward (the same scales, so the same float8 values).
    const auto w_t = cast(weight.t(), scales[1], torch::kFloat8_e4m3fn);
    const auto grad_input = detail::float8_scaled_mm(g8, {w_t.data.t(), w_t.scale}, g.scalar_type(), false);
    const auto x8 = cast(x, scales[0], torch::kFloat8_e4m3fn);
    const auto grad_weight = detail::float8_scaled_mm({g8.data.t(), g8.scale}, x8, g.scalar_type(), false);
    return {grad_input, grad_weight, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace float8_delayed_impl

torch::Tensor float8_delayed_next_scales(const Float8DelayedState& state, const Float8LinearConfig& config) {
  torch::NoGradGuard no_grad;
  const auto forward = float8_delayed_impl::fold(state, 0, 2, torch::kFloat8_e4m3fn, config, false);
  const auto gradient = float8_delayed_impl::fold(state, 2, 1, torch::kFloat8_e5m2, config, false);
  return torch::cat({forward, gradient});
}

torch::Tensor float8_delayed_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                    const Float8LinearConfig& config, const Float8DelayedState& state, bool record) {
  detail::check_float8_linear_shapes("ampp::float8_delayed_linear", x, weight);
  float8_delayed_impl::check_state(state, weight);
  TORCH_CHECK(config.margin() >= 0, "ampp::Float8LinearConfig::margin must be >= 0, got ", config.margin());
  const auto [input, out_dtype] = detail::float8_product_input(x);
  const float8_delayed_impl::Pass pass{state, config, record, detail::current_float8_layer(),
                                       torch::GradMode::is_enabled()};
  const auto product = float8_delayed_impl::DelayedFloat8Matmul::apply(input.reshape({-1, weight.size(1)}), weight,
                                                                       pass, static_cast<int64_t>(out_dtype));
  return detail::float8_linear_output(product, x.sizes(), bias);
}

#else  // float8 types and ATen's _scaled_mm: LibTorch 2.6 or newer

torch::Tensor float8_delayed_next_scales(const Float8DelayedState&, const Float8LinearConfig&) {
  TORCH_CHECK(false, "ampp::float8_delayed_next_scales needs LibTorch 2.6 or newer; this build has ", TORCH_VERSION);
}
torch::Tensor float8_delayed_linear(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                    const Float8LinearConfig&, const Float8DelayedState&, bool) {
  TORCH_CHECK(false,
              "ampp::float8_delayed_linear needs LibTorch 2.6 or newer (float8 types and ATen's "
              "_scaled_mm); this build has ",
              TORCH_VERSION);
}

#endif

}  // namespace ampp
