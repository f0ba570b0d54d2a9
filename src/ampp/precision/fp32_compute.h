#pragma once
// Bf16Compute::fp32: GEMMs and convolutions whose operands are stored in bf16 (or fp32) but computed
// in fp32, with the result stored in bf16. Custom autograd functions so that backward keeps only the
// stored (bf16) operands alive: upcasting through ordinary ops would make autograd save the fp32
// copies and raise peak memory above a pure fp32 run.

#include <ATen/core/Tensor.h>

#include <vector>

namespace ampp::precision::detail {

// beta * bias + alpha * a @ b (2-D) or batched (3-D); no bias for mm/bmm.
// (Optional, not undefined, tensors: custom autograd functions reject undefined inputs.)
at::Tensor fp32_compute_gemm(const c10::optional<at::Tensor>& bias, const at::Tensor& a, const at::Tensor& b, double beta,
                             double alpha, bool batched);
at::Tensor fp32_compute_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias);
at::Tensor fp32_compute_convolution(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                                    std::vector<int64_t> stride, std::vector<int64_t> padding,
                                    std::vector<int64_t> dilation, bool transposed,
                                    std::vector<int64_t> output_padding, int64_t groups);
at::Tensor cached_round_to_fp16(const at::Tensor& t);

}  // namespace ampp::precision::detail
