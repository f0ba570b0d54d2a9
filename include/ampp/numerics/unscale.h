#pragma once
// Fused gradient unscale + non-finite detection (ampp's CPU implementation of
// aten::_amp_foreach_non_finite_check_and_unscale_, which LibTorch 1.13 only has for CUDA).

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ampp::numerics {

/// For every tensor t in `scaled_grads`, in place: t = t * inv_scale (computed in fp32 for
/// fp32/bf16/fp16, fp64 for double; skipped when inv_scale == 1), and if any element of any tensor is
/// inf, -inf or NaN after unscaling, sets found_inf to 1.0. found_inf is never written to 0: the caller
/// zeroes it first, so one found_inf can collect several calls (exactly like the ATen op).
///
/// Deliberately stricter than ATen's op, which checks the values before the multiply: when inv_scale
/// > 1 (a loss scale below 1) a finite gradient can overflow as it is unscaled, and ATen then lets
/// the optimizer step on the inf. Here the check is on the values as stored, so found_inf == 0
/// guarantees every unscaled element is finite. For |inv_scale| <= 1 both checks agree.
///
/// found_inf, inv_scale: float32, one element, on the grads' device. Tensors: strided, one device.
/// On CPU the tensors may mix float, double, bfloat16 and half (one parallel pass over all of them);
/// on other devices they are grouped by dtype and handed to ATen's op, followed by a check-only pass
/// of the results (compile-guarded; no accelerator build was made here).
void non_finite_check_and_unscale_(at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale);

/// The same, and which tensors held a non-finite value after unscaling: `non_finite_per_tensor` is
/// resized to scaled_grads.size() and entry i set to 1 for each such tensor. On CPU the flags come from
/// the same pass; elsewhere from one check per tensor, made only when something was found.
void non_finite_check_and_unscale_(at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale,
                                   std::vector<uint8_t>& non_finite_per_tensor);

/// The same, for a caller that knows |inv_scale| <= 1 (an inverse scale of 1, or a loss scale known to be
/// at least 1): then a check before the multiply and one after it agree, and on a GPU the second,
/// check-only pass over the gradients is left out (ATen's kernel checks before the multiply).
void non_finite_check_and_unscale_(at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale,
                                   bool inv_scale_at_most_one);

/// True if any element of any tensor is inf/-inf/NaN (the same pass with inv_scale 1, read only).
bool has_non_finite(at::TensorList tensors);

/// Name of the CPU kernel variant in use ("avx2" or "default"; the best one available is picked at
/// the first call).
const char* unscale_kernel_variant();

/// The CPU kernel variants built into this binary that this CPU can run ("default" always first).
std::vector<std::string> unscale_kernel_variants();

/// Selects a variant by name (for tests and benchmarks); false if it is not available. Do not call
/// while a kernel is running.
bool set_unscale_kernel_variant(const std::string& name);

}  // namespace ampp::numerics
