// Op policy tables: PyTorch 1.13.1's autocast lists (dumped from its dispatcher, see
// docs/precision.md), updated for the LibTorch ampp runs on (torch_compat.h) and filtered by what
// its dispatcher registers; defaults, changeable at run time.

#include <ampp/precision/op_policy.h>

#include "detail.h"
#include "torch_compat.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <unordered_map>

namespace ampp {
namespace {

using Table = std::unordered_map<std::string, CastPolicy>;

// clang-format off: the op tables are laid out for reading, not by the formatter.
// PyTorch 1.13.1 CPU lists (AutocastCPU registrations).
const char* const kCpuLower[] = {
    "conv1d", "conv1d.padding", "conv2d", "conv2d.padding", "conv3d", "conv3d.padding", "bmm", "mm",
    "baddbmm", "addmm", "addbmm", "linear", "_convolution.deprecated", "matmul", "conv_tbc"};
const char* const kCpuPromote[] = {"stack", "cat", "index_copy", "index_copy.dimname"};
const char* const kCpuFp32[] = {
    "_grid_sampler_2d_cpu_fallback", "_lu_with_info", "adaptive_avg_pool3d", "adaptive_max_pool3d",
    "avg_pool3d", "binary_cross_entropy_with_logits", "cdist", "cholesky",
    "cholesky_inverse", "cholesky_solve", "conv_transpose1d", "conv_transpose2d.input",
    "conv_transpose3d.input", "cosine_embedding_loss", "cross_entropy_loss", "ctc_loss.IntList",
    "ctc_loss.Tensor", "fake_quantize_per_tensor_affine", "fft_fft", "fft_fft2", "fft_fftn", "fft_hfft",
    "fft_ifft", "fft_ifft2", "fft_ifftn", "fft_ihfft", "fft_irfft", "fft_irfft2", "fft_irfftn", "fft_rfft",
    "fft_rfft2", "fft_rfftn", "fractional_max_pool2d", "fractional_max_pool3d", "geqrf", "grid_sampler",
    "grid_sampler_2d", "grid_sampler_3d", "hinge_embedding_loss", "huber_loss", "inverse", "kl_div",
    "l1_loss", "linalg_cholesky", "linalg_cholesky_ex", "linalg_cond", "linalg_cond.p_str", "linalg_eig",
    "linalg_eigh", "linalg_eigvals", "linalg_eigvalsh", "linalg_householder_product", "linalg_inv",
    "linalg_inv_ex", "linalg_lstsq", "linalg_matrix_norm", "linalg_matrix_norm.str_ord",
    "linalg_matrix_rank", "linalg_matrix_rank.atol_rtol_float", "linalg_matrix_rank.atol_rtol_tensor",
    "linalg_matrix_rank.tol_tensor", "linalg_qr", "linalg_solve", "linalg_svd", "linalg_svdvals",
    "linalg_tensorinv", "linalg_tensorsolve", "lu_solve", "margin_ranking_loss", "max_pool3d",
    "max_unpool2d", "max_unpool3d", "mse_loss", "multi_margin_loss", "multilabel_margin_loss",
    "multilabel_margin_loss_forward", "nanquantile", "nanquantile.scalar", "nll_loss", "nll_loss2d", "orgqr",
    "ormqr", "pinverse", "poisson_nll_loss", "polar", "prod", "prod.dim_Dimname", "prod.dim_int", "qr",
    "quantile", "quantile.scalar", "reflection_pad1d", "reflection_pad2d", "replication_pad1d",
    "replication_pad2d", "replication_pad3d", "smooth_l1_loss", "soft_margin_loss", "stft", "stft.center",
    "svd", "symeig", "trace", "triangular_solve", "triplet_margin_loss", "view_as_complex"};
// PyTorch runs binary_cross_entropy in fp32 on CPU and bans it on CUDA. It is unsafe in fp16 (a
// saturated sigmoid gives log(0)), so ampp bans it whenever the region's dtype is fp16 (CPU fp16 is
// emulated CUDA fp16) and runs it in fp32 under bf16, as PyTorch's CPU autocast does.
const char* const kCpuBanned[] = {"binary_cross_entropy"};

// PyTorch 1.13.1 CUDA lists (AutocastCUDA registrations).
const char* const kCudaLower[] = {
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "cudnn_convolution",
    "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"};
const char* const kCudaFp32[] = {
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "frobenius_norm", "frobenius_norm.dim", "nuclear_norm",
    "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
    "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp"};
const char* const kCudaFp32SetOptDtype[] = {
    "prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname", "log_softmax.int",
    "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum", "cumsum.dimname", "sum",
    "sum.dim_IntList", "sum.dim_DimnameList"};
const char* const kCudaFp32AppendDtype[] = {"norm.Scalar", "norm.ScalarOpt_dim", "norm.names_ScalarOpt_dim"};
const char* const kCudaPromote[] = {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler",
                                    "index_put", "tensordot", "scatter_add"};
const char* const kCudaBanned[] = {"binary_cross_entropy"};
// clang-format on

template <size_t N>
void fill(Table& t, const char* const (&ops)[N], CastPolicy p) {
  for (const char* op : ops) t[op] = p;
}

// Whether this LibTorch autocasts the op on CUDA: a kernel on AutocastCUDA (which CPU builds register
// too, except for cuDNN's ops).
bool autocast_cuda_has(const std::string& key) {
  const auto dot = key.find('.');
  const std::string overload = dot == std::string::npos ? "" : key.substr(dot + 1);
  const auto op = c10::Dispatcher::singleton().findSchema({"aten::" + key.substr(0, dot), overload});
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::AutocastCUDA);
}

Table default_table(c10::DeviceType device_type) {
  Table t;
  if (device_type == c10::DeviceType::CPU) {
    fill(t, kCpuLower, CastPolicy::kLowerPrecision);
    fill(t, kCpuPromote, CastPolicy::kPromote);
    fill(t, kCpuFp32, CastPolicy::kFp32);
    fill(t, kCpuBanned, CastPolicy::kBanned);
    for (const auto& [key, policy] : precision::compat::cpu_policy_changes()) t[key] = policy;
    // LibTorch's own CPU list is the reference: an op it does not autocast, ampp does not either.
    const auto& libtorch = precision::detail::libtorch_cpu_autocast_ops();
    for (auto it = t.begin(); it != t.end();) it = libtorch.count(it->first) ? std::next(it) : t.erase(it);
  } else {
    fill(t, kCudaLower, CastPolicy::kLowerPrecision);
    fill(t, kCudaFp32, CastPolicy::kFp32);
    fill(t, kCudaFp32SetOptDtype, CastPolicy::kFp32SetOptDtype);
    fill(t, kCudaFp32AppendDtype, CastPolicy::kFp32AppendDtype);
    fill(t, kCudaPromote, CastPolicy::kPromote);
    fill(t, kCudaBanned, CastPolicy::kBanned);
    for (const auto& [key, policy] : precision::compat::cuda_policy_changes()) t[key] = policy;
    // Drop removals and ops this LibTorch does not autocast on CUDA (a test checks the result against
    // LibTorch's AutocastCUDA registrations).
    for (auto it = t.begin(); it != t.end();)
      it = it->second != CastPolicy::kNone && autocast_cuda_has(it->first) ? std::next(it) : t.erase(it);
  }
  return t;
}

void check_device(c10::DeviceType device_type) {
  TORCH_CHECK(device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA,
              "ampp autocast op policies exist for torch::kCPU and torch::kCUDA only, got ",
              c10::DeviceTypeName(device_type), "; pass one of those two device types");
}

struct Registry {
  std::shared_mutex mutex;
  Table cpu = default_table(c10::DeviceType::CPU);
  Table cuda = default_table(c10::DeviceType::CUDA);
  Table cpu_user;  // CPU registrations made through register_op_policy (kNone included): they win
                   // over the CUDA table in fp16 regions that follow the CUDA lists
  Table& of(c10::DeviceType d) { return d == c10::DeviceType::CPU ? cpu : cuda; }
};

Registry& registry() {
  static Registry r;
  return r;
}

CastPolicy policy_in(const Table& t, const std::string& key) {
  auto it = t.find(key);
  return it == t.end() ? CastPolicy::kNone : it->second;
}

// Splits "name.overload" and checks that the op exists and can be autocast.
c10::OperatorHandle find_op(const std::string& key) {
  const auto dot = key.find('.');
  const std::string name = "aten::" + key.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : key.substr(dot + 1);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(handle.has_value(), "ampp: no op named '", name, overload.empty() ? "" : ".", overload,
              "' is registered in this LibTorch; use an aten operator name such as \"mm\" or "
              "\"conv2d.padding\" (the overload after a dot; none means the default overload)");
  TORCH_CHECK(!handle->schema().is_mutable(), "ampp: '", key,
              "' mutates its arguments (in-place or out= op); autocast only applies to out-of-place ops, "
              "register the out-of-place variant instead");
  return *handle;
}

}  // namespace

const char* to_string(CastPolicy policy) {
  switch (policy) {
    case CastPolicy::kNone:
      return "none";
    case CastPolicy::kLowerPrecision:
      return "lower_precision";
    case CastPolicy::kFp32:
      return "fp32";
    case CastPolicy::kFp32SetOptDtype:
      return "fp32_set_opt_dtype";
    case CastPolicy::kFp32AppendDtype:
      return "fp32_append_dtype";
    case CastPolicy::kPromote:
      return "promote";
    case CastPolicy::kBanned:
      return "banned";
  }
  return "?";
}

CastPolicy policy_of(const std::string& op, c10::DeviceType device_type) {
  check_device(device_type);
  return precision::detail::table_policy(precision::detail::normalize_op_name(op), device_type);
}

std::vector<std::string> ops_with_policy(CastPolicy policy, c10::DeviceType device_type) {
  check_device(device_type);
  std::vector<std::string> out;
  auto& r = registry();
  {
    std::shared_lock<std::shared_mutex> lock(r.mutex);
    for (const auto& [name, p] : r.of(device_type))
      if (p == policy) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void register_op_policy(const std::string& op, CastPolicy policy, c10::DeviceType device_type) {
  check_device(device_type);
  TORCH_CHECK(policy == CastPolicy::kNone || policy == CastPolicy::kLowerPrecision || policy == CastPolicy::kFp32 ||
                  policy == CastPolicy::kPromote || policy == CastPolicy::kBanned,
              "ampp::register_op_policy: policy '", to_string(policy),
              "' is reserved for LibTorch's built-in CUDA lists; use lower_precision, fp32, promote, banned "
              "or none");
  const std::string key = precision::detail::normalize_op_name(op);
  find_op(key);
  if (policy != CastPolicy::kNone) precision::detail::install_kernel_for(key, device_type);
  auto& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  if (device_type == c10::DeviceType::CPU) r.cpu_user[key] = policy;
  if (policy == CastPolicy::kNone)
    r.of(device_type).erase(key);
  else
    r.of(device_type)[key] = policy;
}

void register_half_function(const std::string& op, c10::DeviceType device_type) {
  register_op_policy(op, CastPolicy::kLowerPrecision, device_type);
}
void register_float_function(const std::string& op, c10::DeviceType device_type) {
  register_op_policy(op, CastPolicy::kFp32, device_type);
}
void register_promote_function(const std::string& op, c10::DeviceType device_type) {
  register_op_policy(op, CastPolicy::kPromote, device_type);
}

void reset_op_policies(c10::DeviceType device_type) {
  check_device(device_type);
  auto& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  r.of(device_type) = default_table(device_type);
  if (device_type == c10::DeviceType::CPU) r.cpu_user.clear();
}

namespace precision::detail {

std::string normalize_op_name(const std::string& op) {
  TORCH_CHECK(!op.empty(), "ampp: empty op name; pass an aten operator name such as \"mm\"");
  const std::string prefix = "aten::";
  return op.rfind(prefix, 0) == 0 ? op.substr(prefix.size()) : op;
}

std::string policy_key(const c10::OperatorName& name) {
  const std::string prefix = "aten::";
  std::string key = name.name.rfind(prefix, 0) == 0 ? name.name.substr(prefix.size()) : name.name;
  if (!name.overload_name.empty()) key += "." + name.overload_name;
  return key;
}

CastPolicy table_policy(const std::string& key, c10::DeviceType device_type) {
  auto& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  return policy_in(r.of(device_type), key);
}

CastPolicy lookup_policy(const c10::OperatorName& name, c10::DeviceType device_type) {
  return table_policy(policy_key(name), device_type);
}

CastPolicy lookup_emulated_cuda_policy(const c10::OperatorName& name) {
  const std::string key = policy_key(name);
  auto& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  if (r.cpu_user.count(key)) return r.cpu_user.at(key);
  // CUDA casts its RNNs at _cudnn_rnn, outside the table's reach on a CPU (rnn_fp16.cpp).
  return is_cuda_rnn_op(key) ? CastPolicy::kLowerPrecision : policy_in(r.cuda, key);
}

const std::set<std::string>& libtorch_cpu_autocast_ops() {
  // Read once, on first use: that is before ampp registers its own kernels (install_locked asks
  // for default_table_ops(CPU) first), so the set is LibTorch's alone.
  static const std::set<std::string> ops = [] {
    std::set<std::string> out;
    for (const auto& name : c10::Dispatcher::singleton().getRegistrationsForDispatchKey(c10::DispatchKey::AutocastCPU))
      out.insert(policy_key(name));
    return out;
  }();
  return ops;
}

std::vector<std::string> default_table_ops(c10::DeviceType device_type) {
  std::vector<std::string> out;
  for (auto& [k, p] : default_table(device_type)) out.push_back(k);
  return out;
}

}  // namespace precision::detail
}  // namespace ampp
