#pragma once
// fp8 training's Linear: the recipes of torchao.float8 (`Float8Linear`, 0.18), bit for bit on the CPU.
//
//   auto y = ampp::float8_linear(x, weight, bias, ampp::Float8LinearConfig());  // tensorwise
//   auto y = ampp::float8_linear(x, weight, bias,
//                                ampp::Float8LinearConfig::from_recipe_name("rowwise"));
//
// Each matrix product of a Linear's forward and backward (output = x W^T, grad_input = g W,
// grad_weight = g^T x) runs on float8 operands through ATen's `_scaled_mm`: fp8 tensor cores on a
// Hopper GPU (twice bf16's rate), ATen's kernel on the CPU. Each operand is scaled into its float8 range
// first, by a scale computed from its amax at that moment ("dynamic" scaling):
//
//   scale = float32(F8MAX / max(amax, 1e-12))    (in float64; F8MAX = 448 for e4m3, 57344 for e5m2)
//   fp8   = clamp(float32(t) * scale, -F8MAX, F8MAX) rounded to the float8 type (saturating)
//
// - kTensorwise (torchao's default): one scale per tensor; inputs and weights in e4m3, gradients in e5m2
//   (the "hybrid" format: gradients need range more than precision).
// - kRowwise: one scale per row or column of each operand, along the product's inner dimension, rounded
//   down to a power of two (exp2(floor(log2 s)), exact to invert); everything in e4m3. Its products come
//   out in bf16 (ATen's rowwise kernels have no float32 output), also for float32 inputs.
//
// - kDelayed (TransformerEngine's DelayedScaling): one scale per tensor, inputs and weights in e4m3,
//   gradients in e5m2, each scale computed from an amax history of earlier passes instead of the tensor at
//   hand (float8_delayed.h; the state lives in an ampp::Float8Linear).
//
// The backward casts x, W and the gradient again from the high-precision tensors it saved (no fp8 copy is
// kept). The output's dtype is the autocast dtype inside an autocast region of x's device (torchao: CPU
// autocast relabels its fp8 operands; CUDA autocast casts x first), else x's dtype. The bias is added
// after the product, in the output's dtype. Gradients reach x and W in their own dtypes.
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <optional>
#include <string>

namespace ampp {

enum class Float8Recipe { kTensorwise, kRowwise, kDelayed };

// How the delayed recipe reads its amax history (TransformerEngine's amax_compute_algo): the largest amax
// in it, or the most recent one.
enum class Float8AmaxCompute { kMax, kMostRecent };

std::string to_string(Float8Recipe recipe);
Float8Recipe parse_float8_recipe(const std::string& name);  // "tensorwise", "rowwise" or "delayed"

struct Float8LinearConfig {
  // "tensorwise" or "rowwise" (torchao's Float8LinearConfig.from_recipe_name), or "delayed"
  // (TransformerEngine's DelayedScaling with its defaults); other names are an error.
  static Float8LinearConfig from_recipe_name(const std::string& name);
  TORCH_ARG(Float8Recipe, recipe) = Float8Recipe::kTensorwise;
  // The delayed recipe's settings, TransformerEngine's DelayedScaling defaults: the passes the history
  // holds, how it is read, and the margin (each scale divided by 2^margin: headroom for growth).
  TORCH_ARG(int64_t, amax_history_len) = 1024;
  TORCH_ARG(Float8AmaxCompute, amax_compute_algo) = Float8AmaxCompute::kMax;
  TORCH_ARG(int64_t, margin) = 0;
};

// Whether this LibTorch has the float8 types and ATen's _scaled_mm (2.6 or newer); without them every
// function below throws, naming the version.
bool float8_supported();

// The largest finite value of a float8 type: 448 (kFloat8_e4m3fn) or 57344 (kFloat8_e5m2).
double float8_max(c10::ScalarType float8_type);

// The scale that maps `t`'s amax onto float8_type's largest value (float32): over the whole tensor
// (dim nullopt, a 0-dim scale) or along `dim` (keepdim: one scale per slice), optionally rounded down to a
// power of two. No gradient.
torch::Tensor float8_scale(const torch::Tensor& t, c10::ScalarType float8_type, std::optional<int64_t> dim,
                           bool power_of_2);

// `t` times `scale` (broadcast), saturated to float8_type's range and rounded to it.
torch::Tensor to_float8(const torch::Tensor& t, const torch::Tensor& scale, c10::ScalarType float8_type);

// y = x W^T + b with the recipe's fp8 products; x [..., K], weight [N, K], bias [N] or undefined. The
// dynamic recipes only (the delayed one keeps state: float8_delayed_linear).
torch::Tensor float8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            const Float8LinearConfig& config);

}  // namespace ampp
