#pragma once
// What the precision layer needs from LibTorch, one spelling for every supported LibTorch.
#include <ampp/precision/autocast.h>
#include <ampp/util/torch_version.h>

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

// The float8 types and ATen's _scaled_mm on the CPU and CUDA (float8.h): LibTorch 2.6 or newer.
#define AMPP_HAS_FLOAT8 AMPP_TORCH_AT_LEAST(2, 6)

namespace ampp::precision::compat {

// LibTorch's own autocast state. 2.4 (pytorch#124359) made it device-generic
// (is_autocast_enabled(device), get/set_autocast_dtype) and deprecated the per-device calls, which
// then warn on every use; 1.13 has only those.

inline bool autocast_enabled(c10::DeviceType device) {
#if AMPP_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if AMPP_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
#else
  device == c10::DeviceType::CPU ? at::autocast::set_cpu_enabled(enabled) : at::autocast::set_enabled(enabled);
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if AMPP_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if AMPP_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  device == c10::DeviceType::CPU ? at::autocast::set_autocast_cpu_dtype(dtype)
                                 : at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}

// CPU autocast ops whose policy differs from 1.13's lists (op_policy.cpp) in 2.x's AutocastCPU
// registrations: transposed convolutions moved from fp32 to lower precision, and attention, prelu,
// vecdot, fused addmm+activation and oneDNN's RNN layer were added as lower precision. The table
// keeps only ops this LibTorch registers (read from its dispatcher), so each 2.x gets its subset.
inline std::vector<std::pair<const char*, CastPolicy>> cpu_policy_changes() {
#if AMPP_TORCH_AT_LEAST(2, 0)
  const auto lower = CastPolicy::kLowerPrecision;
  return {{"conv_transpose1d", lower},
          {"conv_transpose2d.input", lower},
          {"conv_transpose3d.input", lower},
          {"prelu", lower},
          {"scaled_dot_product_attention", lower},
          {"_native_multi_head_attention", lower},
          {"linalg_vecdot", lower},
          {"_addmm_activation", lower},
          {"mkldnn_rnn_layer", lower},
          {"linalg_matrix_sqrth", CastPolicy::kFp32}};  // new in 2.14
#else
  // 1.13 registers cat as a promote op, yet its cat behaves as ordinary type promotion (fp16 + bf16
  // gives float32, fp16 + fp16 in a bf16 region stays fp16) where 2.x, and 1.13's own stack and
  // index_copy, raise. Observed with Debian's python3-torch 1.13; the oracle test checks it.
  return {{"cat", CastPolicy::kNone}};
#endif
}

// CUDA autocast ops whose policy differs from 1.13's CUDA lists (op_policy.cpp) in the LibTorch built
// against (2.13's AT_FORALL_* lists in ATen/autocast_mode.h): fp16 emulation on CPU follows these.
// Ops a LibTorch does not autocast on CUDA are dropped from the table (op_policy.cpp), so each 2.x, and
// each of its CPU and CUDA builds, gets its subset.
inline std::vector<std::pair<const char*, CastPolicy>> cuda_policy_changes() {
#if AMPP_TORCH_AT_LEAST(2, 0)
  const auto lower = CastPolicy::kLowerPrecision, fp32 = CastPolicy::kFp32;
  const auto set_opt_dtype = CastPolicy::kFp32SetOptDtype;
  return {{"linalg_vecdot", lower},
          {"_cudnn_rnn", lower},          // registered only where LibTorch has cuDNN (its CUDA builds)
          {"linalg_matrix_sqrth", fp32},  // new in 2.14
          {"scaled_dot_product_attention", lower},
          {"_scaled_dot_product_flash_attention", lower},
          {"rms_norm", fp32},
          {"upsample_nearest1d", fp32},
          {"_upsample_nearest_exact1d", fp32},
          {"upsample_nearest2d", fp32},
          {"_upsample_nearest_exact2d", fp32},
          {"upsample_nearest3d", fp32},
          {"_upsample_nearest_exact3d", fp32},
          {"upsample_linear1d", fp32},
          {"upsample_bilinear2d", fp32},
          {"_upsample_bilinear2d_aa", fp32},
          {"upsample_trilinear3d", fp32},
          {"upsample_bicubic2d", fp32},
          {"_upsample_bicubic2d_aa", fp32},
          {"linalg_vector_norm", set_opt_dtype},
          {"linalg_matrix_norm", set_opt_dtype},
          {"linalg_matrix_norm.str_ord", set_opt_dtype},
          {"vdot", CastPolicy::kPromote},
          // 2.x lists these overloads no more (named-tensor variants, the norm names overload).
          {"softmax.Dimname", CastPolicy::kNone},
          {"log_softmax.Dimname", CastPolicy::kNone},
          {"prod.dim_Dimname", CastPolicy::kNone},
          {"cumprod.dimname", CastPolicy::kNone},
          {"cumsum.dimname", CastPolicy::kNone},
          {"sum.dim_DimnameList", CastPolicy::kNone},
          {"norm.names_ScalarOpt_dim", CastPolicy::kNone},
          {"frobenius_norm", CastPolicy::kNone}};
#else
  return {};
#endif
}

// Drops the warnings `drop` accepts and forwards the rest to the handler that was in force.
// 2.0 passes a c10::Warning object to WarningHandler::process and moved the handler accessors to
// c10::WarningUtils; 1.13 passes (location, message, verbatim).
template <typename Drop>
class WarningFilter : public c10::WarningHandler {
 public:
  explicit WarningFilter(Drop drop) : drop_(drop) {}

 private:
  Drop drop_;  // declared first: set before the guard below installs this handler

 public:
#if AMPP_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& warning) override {
    if (!drop_(warning.msg())) previous_->process(warning);
  }

 private:
  c10::WarningHandler* previous_ = c10::WarningUtils::get_warning_handler();
  c10::WarningUtils::WarningHandlerGuard guard_{this};
#else
  void process(const c10::SourceLocation& loc, const std::string& msg, bool verbatim) override {
    if (!drop_(msg)) previous_->process(loc, msg, verbatim);
  }

 private:
  c10::WarningHandler* previous_ = c10::Warning::get_warning_handler();
  c10::Warning::WarningHandlerGuard guard_{this};
#endif
};

}  // namespace ampp::precision::compat
