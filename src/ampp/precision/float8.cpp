// fp8 Linear (float8.h): torchao.float8's recipes, in its order of operations, so that every rounding
// is the same as torchao 0.18's Float8Linear on the same ATen.
#include <ampp/precision/autocast.h>
#include <ampp/precision/float8.h>
#include <ampp/precision/float8_ranges.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include "float8_kernels.h"
#include "torch_compat.h"

namespace ampp {

bool float8_supported() { return AMPP_HAS_FLOAT8; }

std::string to_string(Float8Recipe recipe) {
  switch (recipe) {
    case Float8Recipe::kRowwise:
      return "rowwise";
    case Float8Recipe::kDelayed:
      return "delayed";
    default:
      return "tensorwise";
  }
}

Float8Recipe parse_float8_recipe(const std::string& name) {
  return Float8LinearConfig::from_recipe_name(name).recipe();
}

Float8LinearConfig Float8LinearConfig::from_recipe_name(const std::string& name) {
  if (name == "tensorwise") return Float8LinearConfig().recipe(Float8Recipe::kTensorwise);
  if (name == "delayed") return Float8LinearConfig().recipe(Float8Recipe::kDelayed);
  TORCH_CHECK(name == "rowwise", "unknown fp8 recipe '", name, "': use tensorwise, rowwise or delayed");
  return Float8LinearConfig().recipe(Float8Recipe::kRowwise);
}

#if AMPP_HAS_FLOAT8
namespace detail {

// On the CPU, ATen's reference _scaled_mm: the operands widened to float32 and scaled, one float32 GEMM,
// rounded to `out`. ATen's CPU _scaled_mm takes oneDNN's kernel instead where the CPU has AMX and both
// operands are e4m3: about 1 ulp apart, and 400x slower here (13.6 s for an 8192x128x384 product, against
// 0.03 s in float32), so not for training. The oracle runs torchao with oneDNN off, which takes this path.
static torch::Tensor dequantized_mm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& scale_a,
                                    const torch::Tensor& scale_b, c10::ScalarType out) {
  const auto wide_a = a.contiguous().to(torch::kFloat) * scale_a;
  const auto wide_b = b.contiguous().to(torch::kFloat) * scale_b;
  return wide_a.mm(wide_b).to(out);
}

static bool row_major(const torch::Tensor& m) {
  return m.stride(1) == 1 && m.stride(0) >= std::max<int64_t>(m.size(1), 1);
}
static bool column_major(const torch::Tensor& m) { return row_major(m.t()); }

static int64_t round_up_16(int64_t n) { return (n + 15) / 16 * 16; }

std::pair<Float8Operand, Float8Operand> scaled_mm_operands(const Float8Operand& a, const Float8Operand& b) {
  const int64_t r = a.data.size(1), q = b.data.size(1), pad_r = round_up_16(r) - r, pad_q = round_up_16(q) - q;
  // constant_pad_nd has no float8 kernel: the padding is written into zeros of the padded shape.
  auto padded = [](const torch::Tensor& m, int64_t rows, int64_t cols) {
    if (rows == 0 && cols == 0) return m;
    auto out = torch::zeros({m.size(0) + rows, m.size(1) + cols}, m.options());
    out.narrow(0, 0, m.size(0)).narrow(1, 0, m.size(1)).copy_(m);
    return out;
  };
  Float8Operand pa{padded(a.data, 0, pad_r), a.scale}, pb{padded(b.data, pad_r, pad_q), b.scale};
  if (!row_major(pa.data)) pa.data = pa.data.contiguous();
  if (!column_major(pb.data)) pb.data = pb.data.t().contiguous().t();
  if (pad_q > 0 && b.scale.dim() == 2 && b.scale.size(1) == q)  // rowwise: one scale per column of b
    pb.scale = torch::cat({b.scale, torch::ones({1, pad_q}, b.scale.options())}, 1);
  return {pa, pb};
}

void check_cuda_scaled_mm_operands(const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(row_major(a) && column_major(b),
              "ampp fp8: CUDA's _scaled_mm takes a row-major first and a "
              "column-major second operand, got strides ",
              a.strides(), " and ", b.strides());
  TORCH_CHECK(a.size(1) % 16 == 0 && b.size(1) % 16 == 0,
              "ampp fp8: CUDA's _scaled_mm takes inner and output "
              "dimensions in multiples of 16, got ",
              a.sizes(), " @ ", b.sizes());
}

// As torchao's addmm_float8_unwrapped. Rowwise scales without fast accumulation: unit scales in the kernel
// and the scales' outer product applied after it. Rowwise kernels have no float32 or fp16 output: bf16, then
// `out`.
torch::Tensor float8_scaled_mm(const Float8Operand& a, const Float8Operand& b, c10::ScalarType out, bool fast_accum) {
  const int64_t r = a.data.size(1), q = b.data.size(1);
  const auto [pa, pb] = scaled_mm_operands(a, b);
  check_cuda_scaled_mm_operands(pa.data, pb.data);  // on the CPU too: it runs the shapes a GPU would
  const bool cpu = pa.data.is_cpu();
  // The CPU's product on the unpadded values: zeros would add nothing, but could change its GEMM's blocking.
  const auto a_data = cpu ? pa.data.narrow(1, 0, r) : pa.data;
  const auto b_data = cpu ? pb.data.narrow(0, 0, r).narrow(1, 0, q) : pb.data;
  auto scale_a = a.scale.reciprocal(), scale_b = (cpu ? b.scale : pb.scale).reciprocal();
  const bool rowwise = a.scale.dim() == 2 && b.scale.dim() == 2 && a.scale.size(1) == 1 && b.scale.size(0) == 1;
  torch::Tensor after;
  if (rowwise && !fast_accum) {
    after = scale_a * b.scale.reciprocal();  // [P, 1] x [1, Q]: the unpadded columns'
    scale_a = scale_b = torch::ones({}, scale_a.options());
  }
  const bool via_bf16 = rowwise && (out == torch::kFloat || out == torch::kHalf);
  auto product = cpu ? dequantized_mm(a_data, b_data, scale_a, scale_b, via_bf16 ? torch::kBFloat16 : out)
                     : at::_scaled_mm(a_data, b_data, scale_a, scale_b, std::nullopt, std::nullopt,
                                      via_bf16 ? torch::kBFloat16 : out, fast_accum);
  if (product.size(1) != q) product = product.narrow(1, 0, q).contiguous();
  if (after.defined()) product.mul_(after);
  return via_bf16 ? product.to(out) : product;
}

std::pair<torch::Tensor, c10::ScalarType> float8_product_input(const torch::Tensor& x) {
  const auto device = x.device().type();
  if (!is_autocast_enabled(device)) return {x, x.scalar_type()};
  TORCH_CHECK(device != c10::DeviceType::CPU || !is_fp16_emulated(),
              "ampp::float8_linear: fp16 autocast on the CPU is emulated in float32 tensors, which fp8 products do "
              "not take; use bf16 autocast");
  const auto dtype = autocast_dtype(device);
  if (device == c10::DeviceType::CPU) return {x, dtype};
  return {x.to(dtype), dtype};
}

torch::Tensor float8_linear_output(const torch::Tensor& product, c10::IntArrayRef x_sizes, const torch::Tensor& bias) {
  std::vector<int64_t> shape(x_sizes.begin(), x_sizes.end());
  shape.back() = product.size(-1);
  auto out = product.reshape(shape);
  return bias.defined() ? out + bias.to(out.scalar_type()) : out;
}

void check_float8_linear_shapes(const char* what, const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), what,
              ": x [..., K] and weight [N, K], got x ", x.sizes(), " and weight ", weight.sizes());
}

}  // namespace detail

namespace float8_dynamic {

using detail::Float8Operand;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr double kAmaxFloor = 1e-12;  // torchao's EPS: an all-zero tensor gets a finite scale

Float8Operand cast(const torch::Tensor& t, c10::ScalarType float8_type, std::optional<int64_t> dim, bool power_of_2) {
  auto scale = float8_scale(t, float8_type, dim, power_of_2);
  return {to_float8(t, scale, float8_type), scale};
}

struct RecipeTypes {
  bool rowwise;
  c10::ScalarType gradient;  // e5m2 under tensorwise (range), e4m3 under rowwise
  std::optional<int64_t> along(int64_t dim) const { return rowwise ? std::optional<int64_t>(dim) : std::nullopt; }
};

RecipeTypes types_of(Float8Recipe recipe) {
  const bool rowwise = recipe == Float8Recipe::kRowwise;
  return {rowwise, rowwise ? torch::kFloat8_e4m3fn : torch::kFloat8_e5m2};
}

// out = x @ W^T on float8 operands; x [M, K] and W [N, K] saved in high precision, cast again in backward.
struct Float8Matmul : torch::autograd::Function<Float8Matmul> {
  // `layer`, `measure`: the fp8 doctor's name for it, and whether this pass is one it measures.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               int64_t recipe, int64_t out_dtype, const std::string& layer, bool measure) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    ctx->save_for_backward({x, weight});
    ctx->saved_data["recipe"] = recipe;
    ctx->saved_data["layer"] = layer;
    const auto r = types_of(static_cast<Float8Recipe>(recipe));
    // Rowwise: x along its rows (over K), W^T along its columns (over K): each scale spans the inner dim.
    const auto x8 = cast(x, torch::kFloat8_e4m3fn, r.along(-1), r.rowwise);
    const auto w8 = cast(weight.t(), torch::kFloat8_e4m3fn, r.along(0), r.rowwise);
    if (measure) {
      detail::record_float8_cast(layer, "input", x, x8.scale, x8.data);
      detail::record_float8_cast(layer, "weight", weight.t(), w8.scale, w8.data);
    }
    return detail::float8_scaled_mm(x8, w8, static_cast<c10::ScalarType>(out_dtype), /*fast_accum=*/true);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1];
    const auto& g = grads[0];
    const auto r = types_of(static_cast<Float8Recipe>(ctx->saved_data["recipe"].toInt()));
    // grad_input = g @ W: g per token (over N), W^T per input feature (over N).
    const auto g_rows = cast(g, r.gradient, r.along(-1), r.rowwise);
    detail::record_float8_cast(ctx->saved_data["layer"].toStringRef(), "gradient", g, g_rows.scale, g_rows.data);
    const auto w_cols = cast(weight.t(), torch::kFloat8_e4m3fn, r.along(-1), r.rowwise);
    const auto grad_input =
        detail::float8_scaled_mm(g_rows, {w_cols.data.t(), w_cols.scale.t()}, g.scalar_type(), false);
    // grad_weight = g^T @ x: both per feature, over the tokens M.
    const auto g_cols = cast(g, r.gradient, r.along(0), r.rowwise);
    const auto x_cols = cast(x, torch::kFloat8_e4m3fn, r.along(0), r.rowwise);
    const auto grad_weight =
        detail::float8_scaled_mm({g_cols.data.t(), g_cols.scale.t()}, x_cols, g.scalar_type(), false);
    return {grad_input, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace float8_dynamic

double float8_max(c10::ScalarType float8_type) {
  TORCH_CHECK(float8_type == torch::kFloat8_e4m3fn || float8_type == torch::kFloat8_e5m2,
              "ampp::float8_max: the float8 types are Float8_e4m3fn and Float8_e5m2, got ", float8_type);
  return float8_type == torch::kFloat8_e4m3fn ? 448.0 : 57344.0;
}

torch::Tensor float8_scale(const torch::Tensor& t, c10::ScalarType float8_type, std::optional<int64_t> dim,
                           bool power_of_2) {
  torch::NoGradGuard no_grad;
  const auto magnitude = t.abs();
  const auto amax = dim ? magnitude.amax({*dim}, /*keepdim=*/true) : magnitude.max();
  // torchao's `F8MAX / clamp(amax64, EPS)`: Python's scalar / tensor, which ATen computes as
  // reciprocal(tensor) * scalar, in float64; then rounded to float32.
  auto scale = (amax.to(torch::kDouble).clamp_min(float8_dynamic::kAmaxFloor).reciprocal() * float8_max(float8_type))
                   .to(torch::kFloat);
  // Down to a power of two, as torchao: the float32 log2 can round up to the next integer just below a
  // power of two, which the cast's saturation then absorbs.
  if (power_of_2) scale = torch::exp2(torch::floor(torch::log2(scale)));
  return scale;
}

torch::Tensor to_float8(const torch::Tensor& t, const torch::Tensor& scale, c10::ScalarType float8_type) {
  const double most = float8_max(float8_type);
  return (t.to(torch::kFloat) * scale).clamp(-most, most).to(float8_type);
}

torch::Tensor float8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            const Float8LinearConfig& config) {
  detail::check_float8_linear_shapes("ampp::float8_linear", x, weight);
  TORCH_CHECK(config.recipe() != Float8Recipe::kDelayed,
              "ampp::float8_linear: the delayed recipe keeps state (amax histories and scales); use "
              "ampp::float8_delayed_linear with a Float8DelayedState, or an ampp::Float8Linear");
  const auto [input, out_dtype] = detail::float8_product_input(x);
  const auto product = float8_dynamic::Float8Matmul::apply(
      input.reshape({-1, weight.size(1)}), weight, static_cast<int64_t>(config.recipe()),
      static_cast<int64_t>(out_dtype), detail::current_float8_layer(), torch::GradMode::is_enabled());
  return detail::float8_linear_output(product, x.sizes(), bias);
}

#else  // float8 types and ATen's _scaled_mm: LibTorch 2.6 or newer

namespace {
[[noreturn]] void no_float8(const char* what) {
  TORCH_CHECK(false, what, " needs LibTorch 2.6 or newer (float8 types and ATen's _scaled_mm); this build has ",
              TORCH_VERSION);
}
}  // namespace

double float8_max(c10::ScalarType) { no_float8("ampp::float8_max"); }
torch::Tensor float8_scale(const torch::Tensor&, c10::ScalarType, std::optional<int64_t>, bool) {
  no_float8("ampp::float8_scale");
}
torch::Tensor to_float8(const torch::Tensor&, const torch::Tensor&, c10::ScalarType) { no_float8("ampp::to_float8"); }
torch::Tensor float8_linear(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                            const Float8LinearConfig&) {
  no_float8("ampp::float8_linear");
}

#endif

}  // namespace ampp
