// ampp's kernel on the AutocastCPU dispatch key: one boxed function for every listed op, which
// looks up the op's CastPolicy at call time (so run-time registrations take effect immediately),
// casts the arguments, and calls the op again with AutocastCPU excluded.

#include "detail.h"
#include "fp32_compute.h"

#include <ampp/precision/kernels.h>
#include <ampp/precision/rounding.h>

#include <ATen/ATen.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#include "torch_compat.h"

#include <memory>
#include <mutex>
#include <set>

namespace ampp::precision {
namespace detail {
namespace {

using Stack = torch::jit::Stack;

bool eligible(const at::Tensor& t) {
  return t.defined() && (t.is_cpu() || t.is_mkldnn()) && at::isFloatingType(t.scalar_type()) &&
         t.scalar_type() != at::kDouble;
}

// Replaces every eligible tensor among the last `n` stack entries (plain, optional, lists) by f(t).
template <class F>
void map_tensors(Stack& stack, size_t n, F&& f) {
  for (auto it = stack.end() - static_cast<std::ptrdiff_t>(n); it != stack.end(); ++it) {
    if (it->isTensor()) {
      const at::Tensor& t = it->toTensor();
      if (eligible(t)) *it = f(t);
    } else if (it->isTensorList()) {
      c10::List<at::Tensor> out;  // a new list: a boxed caller may still hold the old one
      for (const at::Tensor& t : it->toTensorVector()) out.push_back(eligible(t) ? f(t) : t);
      *it = c10::IValue(std::move(out));
    }
  }
}

template <class F>
void for_each_tensor(Stack& stack, size_t n, F&& f) {
  map_tensors(stack, n, [&](const at::Tensor& t) {
    f(t);
    return t;
  });
}

void call_without_autocast(const c10::OperatorHandle& op, Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  op.callBoxed(stack);
}

// Past this op's AutocastCPU kernel with autocast still on, as LibTorch's fallthrough: a composite op's inner ops
// (an LSTM's mkldnn_rnn_layer, einsum's bmm) are then autocast by their own policies.
void redispatch_past_autocast(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* stack) {
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::AutocastCPU), stack);
}

// Autocast's promote rule: fp32 wins, lower+lower stays lower, fp64 is ignored, two different lower
// types are an error (as LibTorch's at::autocast::prioritize).
c10::ScalarType promote_type(Stack& stack, size_t n, c10::ScalarType lower) {
  c10::ScalarType result = lower;
  for_each_tensor(stack, n, [&](const at::Tensor& t) {
    const auto type = t.scalar_type();
    if (result == at::kFloat || type == at::kFloat)
      result = at::kFloat;
    else
      TORCH_CHECK(type == lower,
                  "ampp::autocast: promote op got tensors of two different lower-precision "
                  "types (",
                  c10::toString(type), " and ", c10::toString(lower), "); cast them to one dtype first");
  });
  return result;
}

void banned_error(const std::string& key) {
  TORCH_CHECK(false, "ampp::autocast: ", key,
              " is unsafe to autocast in fp16 (e.g. torch::nn::BCELoss after a sigmoid: a saturated "
              "probability rounds to 1 and log(0) follows).\nCombine the sigmoid and the loss as "
              "torch::binary_cross_entropy_with_logits / torch::nn::BCEWithLogitsLoss, which is safe to "
              "autocast, or run this op outside the region (or pass AutocastOptions().allow_banned(true) to "
              "run it in fp32).");
}

c10::optional<at::Tensor> opt_tensor(const c10::IValue& v) {
  return v.isNone() ? c10::nullopt : c10::optional<at::Tensor>(v.toTensor());
}

// conv{1,2,3}d's int[N] arguments may come as one element meaning "the same for every dimension".
std::vector<int64_t> expand(const c10::IValue& v, size_t spatial) {
  auto list = v.toIntVector();
  if (list.size() == 1) list.assign(spatial, list[0]);
  return list;
}

// conv{1,2,3}d(input, weight, bias, stride, padding, dilation, groups) as aten::convolution, with
// the unbatched form (input without batch dimension) handled as conv*d does.
at::Tensor conv_stored_operands(const c10::IValue* args, at::ScalarType compute) {
  at::Tensor x = args[0].toTensor();
  const at::Tensor& w = args[1].toTensor();
  const size_t spatial = static_cast<size_t>(w.dim() - 2);
  const bool unbatched = x.dim() == w.dim() - 1;
  if (unbatched) x = x.unsqueeze(0);
  at::Tensor out = stored_operand_convolution(x, w, opt_tensor(args[2]), expand(args[3], spatial),
                                              expand(args[4], spatial), expand(args[5], spatial), false,
                                              std::vector<int64_t>(spatial, 0), args[6].toInt(), compute);
  return unbatched ? out.squeeze(0) : out;
}

// A lower-precision op under CPU bf16 with `compute` = kFloat (Bf16Compute::kFp32) or kBFloat16
// (native). GEMMs/convolutions go through ampp's stored-operand autograd functions; returns with the
// result on the stack, or false if the op is not one of those (caller casts as usual).
bool lower_bf16(const std::string& key, const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* stack, size_t n,
                at::ScalarType compute) {
  auto args = stack->end() - static_cast<std::ptrdiff_t>(n);
  auto eligible_arg = [&](size_t i) { return args[i].isTensor() && eligible(args[i].toTensor()); };
  at::Tensor out;
  if ((key == "mm" || key == "bmm") && eligible_arg(0) && eligible_arg(1)) {
    out = stored_operand_gemm(c10::nullopt, args[0].toTensor(), args[1].toTensor(), 0.0, 1.0, key == "bmm", compute);
  } else if ((key == "addmm" || key == "baddbmm") && eligible_arg(0) && eligible_arg(1) && eligible_arg(2)) {
    out = stored_operand_gemm(args[0].toTensor(), args[1].toTensor(), args[2].toTensor(), args[3].toScalar().toDouble(),
                              args[4].toScalar().toDouble(), key == "baddbmm", compute);
  } else if (key == "linear" && eligible_arg(0) && eligible_arg(1)) {
    out = stored_operand_linear(args[0].toTensor(), args[1].toTensor(), opt_tensor(args[2]), compute);
  } else if ((key == "conv1d" || key == "conv2d" || key == "conv3d") && eligible_arg(0) && eligible_arg(1)) {
    out = conv_stored_operands(&args[0], compute);
  } else if (key == "matmul" && args[1].isTensor() && args[1].toTensor().dim() == 1) {
    // A 1-D second operand decomposes into mv or dot, which are not lower-precision ops on CPU (and
    // need one dtype): compute in fp32 and store the result in bf16, PyTorch's dtype for matmul.
    map_tensors(*stack, n, [](const at::Tensor& t) { return t.to(at::kFloat); });
    call_without_autocast(op, stack);
    map_tensors(*stack, 1, [](const at::Tensor& t) { return t.to(at::kBFloat16); });
    return true;
  } else if (key == "matmul") {
    // A composite op: let it decompose, with autocast still on, into the mm/bmm handled above.
    redispatch_past_autocast(op, ks, stack);
    return true;
  } else if (compute == at::kBFloat16) {
    return false;
  } else {
    // Anything else (addbmm, conv*d.padding, conv_tbc, user-registered ops): upcast, compute, store bf16. Correct, but
    // autograd keeps the fp32 copies it needs for backward.
    map_tensors(*stack, n, [](const at::Tensor& t) { return t.to(at::kFloat); });
    call_without_autocast(op, stack);
    map_tensors(*stack, op.schema().returns().size(), [](const at::Tensor& t) { return t.to(at::kBFloat16); });
    return true;
  }
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
  return true;
}

void autocast_cpu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* stack) {
  const auto& region = cpu_region();
  const c10::ScalarType lower = region.active ? region.dtype : compat::autocast_dtype(c10::DeviceType::CPU);
  const bool fp16 = lower == at::kHalf;
  const bool fp32_compute = region.active && !fp16 && region.bf16_compute == Bf16Compute::kFp32;
  const size_t n = op.schema().arguments().size();
  const std::string key = policy_key(op.operator_name());

  CastPolicy policy = fp16 && region.active && region.fp16_op_lists == Fp16OpLists::kCuda
                          ? lookup_emulated_cuda_policy(op.operator_name())
                          : lookup_policy(op.operator_name(), c10::DeviceType::CPU);
  // The CUDA lists' dtype policies: under emulation the fp16 values travel in float32 carriers, so
  // computing in float32 (with the dtype argument left alone) gives the same float32 result.
  if (policy == CastPolicy::kFp32SetOptDtype || policy == CastPolicy::kFp32AppendDtype) policy = CastPolicy::kFp32;
  if (policy == CastPolicy::kBanned) {
    if (fp16 && !region.allow_banned) banned_error(key);
    policy = CastPolicy::kFp32;  // bf16 (PyTorch's CPU behaviour) or allow_banned
  }
  switch (policy) {
    case CastPolicy::kFp32:
      map_tensors(*stack, n, [](const at::Tensor& t) { return t.to(at::kFloat); });
      break;
    case CastPolicy::kPromote: {
      const auto to = promote_type(*stack, n, lower);
      map_tensors(*stack, n, [to](const at::Tensor& t) { return t.to(to); });
      break;
    }
    case CastPolicy::kLowerPrecision:
      if (fp16) {
        // fp16 emulation: inputs rounded to fp16 values, fp32 arithmetic, output rounded to fp16.
        map_tensors(*stack, n, [](const at::Tensor& t) { return cached_round_to_fp16(t); });
        call_without_autocast(op, stack);
        map_tensors(*stack, op.schema().returns().size(), [](const at::Tensor& t) { return round_to_fp16(t); });
        return;
      }
      // Native bf16 uses plain (cached) casts like LibTorch: measured faster and no larger than routing
      // it through the stored-operand functions (docs/precision.md).
      if (fp32_compute && lower_bf16(key, op, ks, stack, n, at::kFloat)) return;
      map_tensors(*stack, n,
                  [lower](const at::Tensor& t) { return at::autocast::cached_cast(lower, t, c10::DeviceType::CPU); });
      break;
    default:  // none: an op whose registration was removed, or one only the other lists name (an RNN in a bf16
              // region once fp16 regions installed its kernel) runs as if ampp had no kernel for it
      redispatch_past_autocast(op, ks, stack);
      return;
  }
  call_without_autocast(op, stack);
}

// LibTorch warns "Overriding a previously registered kernel" once per replaced op; that is the
// intended effect here, so those warnings are dropped while ampp registers.
bool is_override_warning(const std::string& msg) {
  return msg.find("Overriding a previously registered kernel") != std::string::npos;
}
using QuietOverrides = compat::WarningFilter<decltype(&is_override_warning)>;

struct Installed {
  std::mutex mutex;
  std::unique_ptr<torch::Library> library;
  std::set<std::string> ops;
  bool cuda_lists = false;  // the CUDA table's ops are registered too (fp16 emulation)

  void add(const std::string& key) {
    if (!ops.insert(key).second) return;
    library->impl(key.c_str(), torch::CppFunction::makeFromBoxedFunction<&autocast_cpu_kernel>());
  }
};

Installed& installed() {
  static Installed* i = new Installed();  // never destroyed: kernels may run during static teardown
  return *i;
}

void install_locked(Installed& inst) {
  if (inst.library) return;
  QuietOverrides quiet(&is_override_warning);
  libtorch_cpu_autocast_ops();  // snapshot LibTorch's own list before ampp registers over it
  inst.library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", c10::make_optional(c10::DispatchKey::AutocastCPU), __FILE__, __LINE__);
  for (const auto& key : default_table_ops(c10::DeviceType::CPU)) inst.add(key);
  for (const auto& key : ops_with_policy(CastPolicy::kLowerPrecision)) inst.add(key);  // user additions
  for (const auto& key : ops_with_policy(CastPolicy::kFp32)) inst.add(key);
  for (const auto& key : ops_with_policy(CastPolicy::kPromote)) inst.add(key);
  for (const auto& key : ops_with_policy(CastPolicy::kBanned)) inst.add(key);
}

}  // namespace

void ensure_kernels_installed() {
  auto& inst = installed();
  std::lock_guard<std::mutex> lock(inst.mutex);
  install_locked(inst);
}

void ensure_cuda_list_kernels_installed() {
  auto& inst = installed();
  std::lock_guard<std::mutex> lock(inst.mutex);
  install_locked(inst);
  if (inst.cuda_lists) return;
  QuietOverrides quiet(&is_override_warning);
  // Ops outside the CPU table (exp, sum, mv, ...) then pass through ampp's kernel in bf16 regions too,
  // where their CPU policy is none: so this waits for the first fp16 region that needs it.
  for (const auto& key : default_table_ops(c10::DeviceType::CUDA)) inst.add(key);
  for (const auto& key : cuda_rnn_ops()) inst.add(key);
  inst.cuda_lists = true;
}

void install_kernel_for(const std::string& key, c10::DeviceType device_type) {
  TORCH_CHECK(device_type == c10::DeviceType::CPU,
              "ampp: op policies can only be changed for torch::kCPU; the CUDA lists are LibTorch's built-in ones");
  auto& inst = installed();
  std::lock_guard<std::mutex> lock(inst.mutex);
  if (!inst.library) return;  // installed with the full table on first use
  QuietOverrides quiet(&is_override_warning);
  inst.add(key);
}

}  // namespace detail

void install_autocast_kernels() { detail::ensure_kernels_installed(); }

void uninstall_autocast_kernels() {
  auto& inst = detail::installed();
  std::lock_guard<std::mutex> lock(inst.mutex);
  inst.library.reset();  // deregisters: LibTorch's kernels are in force again
  inst.ops.clear();
  inst.cuda_lists = false;
}

bool autocast_kernels_installed() {
  auto& inst = detail::installed();
  std::lock_guard<std::mutex> lock(inst.mutex);
  return inst.library != nullptr;
}

}  // namespace ampp::precision
