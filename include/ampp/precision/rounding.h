#pragma once
// Rounding of float tensors to the values representable in a lower-precision format, keeping the
// float32 dtype. Differentiable: autograd rounds the gradient the same way.

#include <ATen/core/Tensor.h>

namespace ampp::precision {

/// IEEE binary16 round-to-nearest-even: |x| >= 65520 -> inf, below 2^-24 -> subnormal steps/zero.
at::Tensor round_to_fp16(const at::Tensor& t);
/// bfloat16 round-to-nearest-even (8 exponent bits: same range as float32, 8-bit significand).
at::Tensor round_to_bf16(const at::Tensor& t);

}  // namespace ampp::precision
