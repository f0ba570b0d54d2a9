#pragma once
// Internal state shared by the precision layer's translation units.

#include <ampp/precision/autocast.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <set>
#include <string>
#include <vector>

namespace ampp::precision::detail {

// ampp's per-thread view of the CPU autocast region. LibTorch's own flag (AutocastCPU excluded or
// not) says whether kernels run at all; this says what they do. When `active` is false but
// LibTorch's flag is on (a user called at::autocast::set_cpu_enabled), kernels behave like
// LibTorch's: bf16 via at::autocast::get_autocast_cpu_dtype(), native compute.
struct CpuRegion {
  bool active = false;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
  Bf16Compute bf16_compute = Bf16Compute::kNative;
  bool allow_banned = false;
  Fp16OpLists fp16_op_lists = Fp16OpLists::kCuda;
};
CpuRegion& cpu_region();

// "addmm", "conv2d.padding": the key of the policy tables.
std::string policy_key(const c10::OperatorName& name);
std::string normalize_op_name(const std::string& op);  // strips "aten::"
CastPolicy lookup_policy(const c10::OperatorName& name, c10::DeviceType device_type);
// The policy of a table key ("addmm", "conv2d.padding") in `device_type`'s table (kNone if unlisted).
CastPolicy table_policy(const std::string& key, c10::DeviceType device_type);
// fp16 emulation following the CUDA lists: a user's CPU registration if there is one, else the CUDA table (and
// lower precision for CUDA's RNN ops).
CastPolicy lookup_emulated_cuda_policy(const c10::OperatorName& name);
// CUDA's RNN ops as the CPU sees them (lstm.input, gru.data, ...): CUDA autocasts them to fp16 at _cudnn_rnn, which
// the CPU never reaches, so fp16 emulation lowers them here (rnn_fp16.cpp).
const std::vector<std::string>& cuda_rnn_ops();
bool is_cuda_rnn_op(const std::string& key);
// Keys of the ops LibTorch registers on AutocastCPU (its own CPU list), read before ampp's install.
const std::set<std::string>& libtorch_cpu_autocast_ops();
// Keys of the default table of `device_type`: the ops ampp registers its kernel for on AutocastCPU
// (the CPU table's replace LibTorch's kernels; the CUDA table's serve the fp16 emulation).
std::vector<std::string> default_table_ops(c10::DeviceType device_type);

// Registers ampp's kernel on the AutocastCPU key for every listed op (lazily, once).
void ensure_kernels_installed();
// The same for the CUDA table's ops, which fp16 emulation follows (lazily, at the first such region).
void ensure_cuda_list_kernels_installed();
// Registers the kernel for one more op (user registration); no-op if already there.
void install_kernel_for(const std::string& key, c10::DeviceType device_type);

// Per-thread cache of fp16-rounded fp32 leaf tensors (fp16 emulation).
void clear_fp16_cache();

}  // namespace ampp::precision::detail
