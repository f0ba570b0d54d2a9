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

struct Gemm : torch::autograd::Function<Gemm> {
  static at::Tensor forward(AutogradContext* ctx, const c10::optional<at::Tensor>& bias, const at::Tensor& a,
                            const at::Tensor& b, double beta, double alpha, bool batched, at::ScalarType ct) {
    NoAutocast no_autocast;
    ctx->saved_data["ct"] = ct;
    at::Tensor out;
    if (has(bias))
      out = batched ? at::baddbmm(cast(bias, ct), cast(a, ct), cast(b, ct), beta, alpha) : at::addmm(cast(bias, ct), cast(a, ct), cast(b, ct), beta, alpha);
    else
      out = batched ? at::bmm(cast(a, ct), cast(b, ct)) : at::mm(cast(a, ct), cast(b, ct));
    ctx->save_for_backward({a, b});
    ctx->saved_data["beta"] = beta;
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["batched"] = batched;
    ctx->saved_data["has_bias"] = has(bias);
    if (has(bias)) {
      ctx->saved_data["bias_sizes"] = bias->sizes().vec();
      ctx->saved_data["bias_dtype"] = bias->scalar_type();
    }
    return out.to(at::kBFloat16);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const auto ct = ctx->saved_data["ct"].toScalarType();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& a = saved[0];
    const at::Tensor& b = saved[1];
    const double alpha = ctx->saved_data["alpha"].toDouble();
    const double beta = ctx->saved_data["beta"].toDouble();
    const bool batched = ctx->saved_data["batched"].toBool();
    const at::Tensor g = cast(grads[0], ct);
    grads[0] = at::Tensor();  // the bf16 gradient is not needed once cast: keep peak memory down
    at::Tensor ga, gb, gbias;
    // needs_input_grad counts tensor inputs only: without a bias, a and b are inputs 0 and 1.
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
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
      gbias = at::sum_to(beta == 1.0 ? g : g * beta, ctx->saved_data["bias_sizes"].toIntVector());
      gbias = gbias.to(ctx->saved_data["bias_dtype"].toScalarType());
    }
    return {gbias, ga, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct Linear : torch::autograd::Function<Linear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& bias, at::ScalarType ct) {
    NoAutocast no_autocast;
    ctx->saved_data["ct"] = ct;
    at::Tensor out = at::linear(cast(x, ct), cast(w, ct), has(bias) ? c10::optional<at::Tensor>(cast(bias, ct)) : c10::nullopt);
    ctx->save_for_backward({x, w});
    ctx->saved_data["has_bias"] = has(bias);
    if (has(bias)) ctx->saved_data["bias_dtype"] = bias->scalar_type();
    return out.to(at::kBFloat16);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const auto ct = ctx->saved_data["ct"].toScalarType();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor g = cast(grads[0], ct);
    grads[0] = at::Tensor();  // the bf16 gradient is not needed once cast: keep peak memory down
    const int64_t out_features = w.size(0);
    const at::Tensor g2d = g.reshape({-1, out_features});
    at::Tensor gx, gw, gbias;
    if (ctx->needs_input_grad(0)) gx = as_dtype_of(g.matmul(cast(w, ct)), x);
    if (ctx->needs_input_grad(1)) gw = as_dtype_of(g2d.t().mm(cast(x, ct).reshape({-1, w.size(1)})), w);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2))
      gbias = g2d.sum(0).to(ctx->saved_data["bias_dtype"].toScalarType());
    return {gx, gw, gbias, at::Tensor()};
  }
};

struct Convolution : torch::autograd::Function<Convolution> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& bias,
                            std::vector<int64_t> stride, std::vector<int64_t> padding,
                            std::vector<int64_t> dilation, bool transposed, std::vector<int64_t> output_padding,
                            int64_t groups, at::ScalarType ct) {
    NoAutocast no_autocast;
    ctx->saved_data["ct"] = ct;
    at::Tensor out = at::convolution(cast(x, ct), cast(w, ct), has(bias) ? c10::optional<at::Tensor>(cast(bias, ct)) : c10::nullopt,
                                     stride, padding, dilation, transposed, output_padding, groups);
    ctx->save_for_backward({x, w});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["transposed"] = transposed;
    ctx->saved_data["output_padding"] = output_padding;
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["has_bias"] = has(bias);
    if (has(bias)) {
      ctx->saved_data["bias_sizes"] = bias->sizes().vec();
      ctx->saved_data["bias_dtype"] = bias->scalar_type();
    }
    return out.to(at::kBFloat16);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const auto ct = ctx->saved_data["ct"].toScalarType();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    std::vector<int64_t> bias_sizes;
    if (has_bias) bias_sizes = ctx->saved_data["bias_sizes"].toIntVector();
    const std::array<bool, 3> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                   has_bias && ctx->needs_input_grad(2)};
    const at::Tensor g = cast(grads[0], ct);
    grads[0] = at::Tensor();
    auto [gx, gw, gbias] = at::convolution_backward(
        g, cast(x, ct), cast(w, ct), has_bias ? at::OptionalIntArrayRef(bias_sizes) : c10::nullopt,
        ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
        ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["transposed"].toBool(),
        ctx->saved_data["output_padding"].toIntVector(), ctx->saved_data["groups"].toInt(), mask);
    if (gbias.defined()) gbias = gbias.to(ctx->saved_data["bias_dtype"].toScalarType());
    return {as_dtype_of(gx, x), as_dtype_of(gw, w), gbias, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor stored_operand_gemm(const c10::optional<at::Tensor>& bias, const at::Tensor& a, const at::Tensor& b, double beta,
                             double alpha, bool batched, at::ScalarType compute) {
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
