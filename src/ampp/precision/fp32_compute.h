#pragma once
// GEMMs and convolutions under CPU bf16 autocast, as custom autograd functions that save the
// operands as they are *stored* (bf16 activations, fp32 weights) and cast them to the compute dtype
// again in backward. Compute dtype kFloat is Bf16Compute::kFp32 (bf16 storage, fp32 arithmetic);
// kBFloat16 is Bf16Compute::kNative. Output always bf16.
// Why not ordinary casts + ops: autograd would then save the cast copies for backward (fp32 copies
// of bf16 activations, bf16 copies of fp32 weights), which raises peak memory above a pure fp32 run
// for models whose memory is dominated by weights (the reference MLP).

#include <ATen/core/Tensor.h>

#include <vector>

namespace ampp::precision::detail {

// beta * bias + alpha * a @ b (2-D) or batched (3-D); no bias for mm/bmm.
// (Optional, not undefined, tensors: custom autograd functions reject undefined inputs.)
at::Tensor stored_operand_gemm(const c10::optional<at::Tensor>& bias, const at::Tensor& a, const at::Tensor& b,
                               double beta, double alpha, bool batched, at::ScalarType compute);
at::Tensor stored_operand_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                                 at::ScalarType compute);
at::Tensor stored_operand_convolution(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                                      std::vector<int64_t> stride, std::vector<int64_t> padding,
                                      std::vector<int64_t> dilation, bool transposed,
                                      std::vector<int64_t> output_padding, int64_t groups, at::ScalarType compute);
at::Tensor cached_round_to_fp16(const at::Tensor& t);

}  // namespace ampp::precision::detail
