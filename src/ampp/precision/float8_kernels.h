#pragma once
// The pieces every fp8 recipe's Linear shares (float8.cpp, float8_delayed.cpp): the scaled product in
// torchao's operand layout, and how autocast decides the product's input and dtype.
#include <torch/types.h>

#include <utility>
#include <vector>

namespace ampp::detail {

// A float8 operand: its values and the scale they were multiplied by (float32; [] or per row/column).
struct Float8Operand {
  torch::Tensor data, scale;
};

// a @ b of float8 operands (a [P, R], b [R, Q]), rounded to `out`: a row-major, b column-major (what CUDA's
// kernels take), the scales' reciprocals as ATen's scales. On the CPU, ATen's reference kernel's arithmetic
// (float32 GEMM on the widened operands); on a GPU, at::_scaled_mm.
//
// CUDA's _scaled_mm takes R and Q only in multiples of 16; ATen's CPU kernel takes any shape. Both are padded
// with zeros to the next multiple on every device (torchao's pad_inner_dim, and the output's columns cut off
// again), so a token count, batch or --grad-accum that is not a multiple of 16 (R of the weight's gradient)
// trains on a GPU, and the CPU checks the padded operands against CUDA's rules (layouts and shapes) before
// its own product, which it computes on the unpadded values: the same numbers as without padding.
torch::Tensor float8_scaled_mm(const Float8Operand& a, const Float8Operand& b, c10::ScalarType out, bool fast_accum);

// The operands padded for CUDA's _scaled_mm: R and Q rounded up to multiples of 16 with zeros (a rowwise scale
// of b's columns with ones), a row-major and b column-major.
std::pair<Float8Operand, Float8Operand> scaled_mm_operands(const Float8Operand& a, const Float8Operand& b);

// What CUDA's _scaled_mm demands and ATen's CPU kernel does not: a row-major and b column-major, R and Q
// multiples of 16. Throws naming the rule.
void check_cuda_scaled_mm_operands(const torch::Tensor& a, const torch::Tensor& b);

// x as the product sees it, and the product's dtype: torchao casts x to CUDA autocast's dtype first; under
// CPU autocast it relabels its fp8 operands with the autocast dtype (x itself unchanged). fp16 emulated on
// the CPU is refused (its tensors are float32).
std::pair<torch::Tensor, c10::ScalarType> float8_product_input(const torch::Tensor& x);

// The [M, N] product back in x's leading shape, plus the bias (in the output's dtype) where there is one.
torch::Tensor float8_linear_output(const torch::Tensor& product, c10::IntArrayRef x_sizes, const torch::Tensor& bias);

// The shapes float8_linear takes: x [..., K] and weight [N, K].
void check_float8_linear_shapes(const char* what, const torch::Tensor& x, const torch::Tensor& weight);

}  // namespace ampp::detail
