// See fp32_compute.h. Gradients are computed in fp32 from the stored operands and returned in each
// operand's own dtype (bf16 activations get bf16 gradients, fp32 weights fp32 gradients).

#include "fp32_compute.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

namespace ampp::precision::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor cast(const at::Tensor& t, at::ScalarType to) { return t.defined() ? t.to(to) : t; }

at::Tensor cast(const c10::optional<at::Tensor>& t, at::ScalarType to) {
  return t.has_value() ? cast(*t, to) : at::Tensor();
}

bool has(const c10::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

at::Tensor as_dtype_of(const at::Tensor& grad, const at::Tensor& like) {
  return grad.defined() ? grad.to(like.scalar_type()) : grad;
}

// The ops below must not re-enter ampp's autocast kernels (backward may run inside a region).
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKey::AutocastCPU};
};

c10::optional<at::Tensor> cast_bias(const c10::optional<at::Tensor>& bias, at::ScalarType to) {
  return has(bias) ? c10::optional<at::Tensor>(cast(bias, to)) : c10::nullopt;
}

// What every function below keeps for backward: the compute type, the two stored (low-precision)
// operands (not their fp32 casts: that is the memory saving), and the bias's shape and dtype.
void save_operands(AutogradContext* ctx, at::ScalarType ct, const at::Tensor& a, const at::Tensor& b,
                   const c10::optional<at::Tensor>& bias) {
  ctx->saved_data["ct"] = ct;
  ctx->save_for_backward({a, b});
  ctx->saved_data["has_bias"] = has(bias);
  if (has(bias)) {
    ctx->saved_data["bias_sizes"] = bias->sizes().vec();
    ctx->saved_data["bias_dtype"] = bias->scalar_type();
  }
}

struct SavedOperands {
  at::ScalarType ct;
  at::Tensor a, b;
  at::Tensor grad;  // the incoming gradient, cast to ct
  bool has_bias;
};

SavedOperands restore_operands(AutogradContext* ctx, variable_list& grads) {
  SavedOperands s;
  s.ct = ctx->saved_data["ct"].toScalarType();
  const auto saved = ctx->get_saved_variables();
  s.a = saved[0];
  s.b = saved[1];
  s.grad = cast(grads[0], s.ct);
  grads[0] = at::Tensor();  // the bf16 gradient is not needed once cast: keep peak memory down
  s.has_bias = ctx->saved_data["has_bias"].toBool();
  return s;
}

at::Tensor bias_grad_dtype(AutogradContext* ctx, const at::Tensor& gbias) {
  return gbias.defined() ? gbias.to(ctx->saved_data["bias_dtype"].toScalarType()) : gbias;
}

struct Gemm : torch::autograd::Function<Gemm> {
  static at::Tensor forward(AutogradContext* ctx, const c10::optional<at::Tensor>& bias, const at::Tensor& a,
                            const at::Tensor& b, double beta, double alpha, bool batched, at::ScalarType ct) {
    NoAutocast no_autocast;
    at::Tensor out;
    if (has(bias))
      out = batched ? at::baddbmm(cast(bias, ct), cast(a, ct), cast(b, ct), beta, alpha)
                    : at::addmm(cast(bias, ct), cast(a, ct), cast(b, ct), beta, alpha);
    else
      out = batched ? at::bmm(cast(a, ct), cast(b, ct)) : at::mm(cast(a, ct), cast(b, ct));
    save_operands(ctx, ct, a, b, bias);
    ctx->saved_data["beta"] = beta;
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["batched"] = batched;
    return out.to(at::kBFloat16);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const SavedOperands s = restore_operands(ctx, grads);
    const auto ct = s.ct;
    const at::Tensor &a = s.a, &b = s.b, &g = s.grad;
    const double alpha = ctx->saved_data["alpha"].toDouble();
    const double beta = ctx->saved_data["beta"].toDouble();
    const bool batched = ctx->saved_data["batched"].toBool();
    at::Tensor ga, gb, gbias;
    // needs_input_grad counts tensor inputs only: without a bias, a and b are inputs 0 and 1.
    const bool has_bias = s.has_bias;
    const size_t ia = has_bias ? 1 : 0, ib = ia + 1;
    if (ctx->needs_input_grad(ia)) {
      ga = batched ? g.bmm(cast(b, ct).transpose(1, 2)) : g.mm(cast(b, ct).t());
      if (alpha != 1.0) ga.mul_(alpha);
      ga = as_dtype_of(ga, a);
    }
    if (ctx->needs_input_grad(ib)) {
      gb = batched ? cast(a, ct).transpose(1, 2).bmm(g) : cast(a, ct).t().mm(g);
      if (alpha != 1.0) gb.mul_(alpha);
      gb = as_dtype_of(gb, b);
    }
    if (has_bias && ctx->needs_input_grad(0)) {
      gbias = bias_grad_dtype(ctx, at::sum_to(beta == 1.0 ? g : g * beta, ctx->saved_data["bias_sizes"].toIntVector()));
    }
    return {gbias, ga, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct Linear : torch::autograd::Function<Linear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& bias, at::ScalarType ct) {
    NoAutocast no_autocast;
    at::Tensor out = at::linear(cast(x, ct), cast(w, ct), cast_bias(bias, ct));
    save_operands(ctx, ct, x, w, bias);
    return out.to(at::kBFloat16);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const SavedOperands s = restore_operands(ctx, grads);
    const auto ct = s.ct;
    const at::Tensor &x = s.a, &w = s.b, &g = s.grad;
    const int64_t out_features = w.size(0);
    const at::Tensor g2d = g.reshape({-1, out_features});
    at::Tensor gx, gw, gbias;
    if (ctx->needs_input_grad(0)) gx = as_dtype_of(g.matmul(cast(w, ct)), x);
    if (ctx->needs_input_grad(1)) gw = as_dtype_of(g2d.t().mm(cast(x, ct).reshape({-1, w.size(1)})), w);
    if (s.has_bias && ctx->needs_input_grad(2)) gbias = bias_grad_dtype(ctx, g2d.sum(0));
    return {gx, gw, gbias, at::Tensor()};
  }
};

struct Convolution : torch::autograd::Function<Convolution> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& bias, std::vector<int64_t> stride,
                            std::vector<int64_t> padding, std::vector<int64_t> dilation, bool transposed,
                            std::vector<int64_t> output_padding, int64_t groups, at::ScalarType ct) {
    NoAutocast no_autocast;
    at::Tensor out = at::convolution(cast(x, ct), cast(w, ct), cast_bias(bias, ct), stride, padding, dilation,
                                     transposed, output_padding, groups);
    save_operands(ctx, ct, x, w, bias);
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["transposed"] = transposed;
    ctx->saved_data["output_padding"] = output_padding;
    ctx->saved_data["groups"] = groups;
    return out.to(at::kBFloat16);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const SavedOperands s = restore_operands(ctx, grads);
    const auto ct = s.ct;
    const at::Tensor &x = s.a, &w = s.b, &g = s.grad;
    const bool has_bias = s.has_bias;
    std::vector<int64_t> bias_sizes;
    if (has_bias) bias_sizes = ctx->saved_data["bias_sizes"].toIntVector();
    const std::array<bool, 3> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                   has_bias && ctx->needs_input_grad(2)};
    auto [gx, gw, gbias] = at::convolution_backward(
        g, cast(x, ct), cast(w, ct), has_bias ? at::OptionalIntArrayRef(bias_sizes) : c10::nullopt,
        ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
        ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["transposed"].toBool(),
        ctx->saved_data["output_padding"].toIntVector(), ctx->saved_data["groups"].toInt(), mask);
    return {as_dtype_of(gx, x), as_dtype_of(gw, w), bias_grad_dtype(ctx, gbias),
            at::Tensor(),       at::Tensor(),       at::Tensor(),
            at::Tensor(),       at::Tensor(),       at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor stored_operand_gemm(const c10::optional<at::Tensor>& bias, const at::Tensor& a, const at::Tensor& b,
                               double beta, double alpha, bool batched, at::ScalarType compute) {
  return Gemm::apply(bias, a, b, beta, alpha, batched, compute);
}

at::Tensor stored_operand_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                                 at::ScalarType compute) {
  return Linear::apply(x, w, bias, compute);
}

at::Tensor stored_operand_convolution(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                                      std::vector<int64_t> stride, std::vector<int64_t> padding,
                                      std::vector<int64_t> dilation, bool transposed,
                                      std::vector<int64_t> output_padding, int64_t groups, at::ScalarType compute) {
  return Convolution::apply(x, w, bias, std::move(stride), std::move(padding), std::move(dilation), transposed,
                            std::move(output_padding), groups, compute);
}

}  // namespace ampp::precision::detail
