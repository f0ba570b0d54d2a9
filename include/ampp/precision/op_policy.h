#pragma once
// The op policies of ampp::autocast (autocast.h): which ATen ops cast their floating-point tensor arguments
// inside a region, and to what. PyTorch's published lists by default (docs/precision.md); queried with
// policy_of and extended at run time for any registered aten op (apex's register_half_function,
// register_float_function, register_promote_function).
#include <c10/core/DeviceType.h>

#include <string>
#include <vector>

namespace ampp {

/// How an op's floating-point tensor arguments are treated inside an autocast region.
enum class CastPolicy {
  kNone,             ///< not listed: runs in the dtype of its inputs
  kLowerPrecision,   ///< cast to the region's dtype (bf16, fp16); fp32 weights are cached
  kFp32,             ///< cast to float32
  kFp32SetOptDtype,  ///< (CUDA lists) inputs untouched, optional `dtype` argument set to float32
  kFp32AppendDtype,  ///< (CUDA lists) redispatched with dtype=float32 (the `norm` family)
  kPromote,          ///< cast to the widest floating dtype among the arguments
  kBanned,           ///< refuses to run under fp16 (binary_cross_entropy); see allow_banned
};

/// "lower_precision", "fp32", ... (the spelling used by docs and error messages).
const char* to_string(CastPolicy policy);

// Op names are aten operator names with an optional overload: "softmax", "conv2d.padding",
// "aten::addmm" ("aten::" optional). A name without overload means the default overload.

/// The policy of `op` for `device_type` (kCPU or kCUDA). Unlisted ops: CastPolicy::kNone.
CastPolicy policy_of(const std::string& op, c10::DeviceType device_type = c10::DeviceType::CPU);

/// All ops with `policy` for `device_type`, sorted ("name" or "name.overload").
std::vector<std::string> ops_with_policy(CastPolicy policy, c10::DeviceType device_type = c10::DeviceType::CPU);

/// Set the policy of any registered out-of-place aten op; takes effect immediately, for all threads.
/// A CPU registration also applies in fp16 regions that follow the CUDA lists (it overrides them).
/// Throws if the op is not registered or is in-place/out=. CastPolicy::kNone removes it from the lists.
void register_op_policy(const std::string& op, CastPolicy policy, c10::DeviceType device_type = c10::DeviceType::CPU);

/// apex's names. "half" means the region's lower-precision dtype (bf16 or fp16).
void register_half_function(const std::string& op, c10::DeviceType device_type = c10::DeviceType::CPU);
void register_float_function(const std::string& op, c10::DeviceType device_type = c10::DeviceType::CPU);
void register_promote_function(const std::string& op, c10::DeviceType device_type = c10::DeviceType::CPU);

/// Restore the default lists for `device_type` (undo all registrations).
void reset_op_policies(c10::DeviceType device_type = c10::DeviceType::CPU);

}  // namespace ampp
