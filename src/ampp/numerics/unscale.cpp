// Dispatcher of the fused unscale: argument checks (ATen's conditions and messages), CUDA hand-off to
// ATen's own op, and on CPU one parallel pass over fixed-size chunks of all tensors together, so 64
// small grads cost one parallel region instead of 64.

#include <ampp/numerics/unscale.h>

#include "parallel_chunks.h"
#include "torch_compat.h"
#include "unscale_span.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#if AMPP_HAVE_ATEN_AMP_UNSCALE
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#endif

#include <atomic>
#include <map>
#include <vector>

#if defined(AMPP_UNSCALE_HAVE_AVX2)
#include <cpuid.h>
#endif

namespace ampp::numerics {
namespace {

// Elements per work item: 32 Ki (128 KiB of fp32) amortises the per-chunk cost and still splits a
// single large gradient across threads.
constexpr int64_t kChunk = int64_t{1} << 15;
// Below this many elements in total, threads cost more than they save.
constexpr int64_t kSerialBelow = int64_t{1} << 16;

bool avx2_available() {
#if defined(AMPP_UNSCALE_HAVE_AVX2)
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" in __builtin_cpu_supports.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

detail::SpanKernel kernel_named(const std::string& name) {
#if defined(AMPP_UNSCALE_HAVE_AVX2)
  if (name == "avx2" && avx2_available()) return detail::unscale_span_avx2;
#endif
  if (name == "default") return detail::unscale_span_default;
  return nullptr;
}

std::atomic<detail::SpanKernel>& kernel_slot() {
  static std::atomic<detail::SpanKernel> k{avx2_available() ? kernel_named("avx2") : kernel_named("default")};
  return k;
}

detail::SpanKernel kernel() { return kernel_slot().load(std::memory_order_relaxed); }

bool supported_dtype(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

void check_scalars(const at::Tensor& found_inf, const at::Tensor& inv_scale, const at::Device& device) {
  TORCH_CHECK(inv_scale.defined() && found_inf.defined(),
              "non_finite_check_and_unscale_: inv_scale and found_inf must be defined tensors.");
  TORCH_CHECK(inv_scale.device() == device, "inv_scale must be on the device of the gradients (", device, "), got ",
              inv_scale.device(), "; move it with .to(grad.device()).");
  TORCH_CHECK(found_inf.device() == device, "found_inf must be on the device of the gradients (", device, "), got ",
              found_inf.device(), "; create it with torch::zeros({}, grad.options().dtype(torch::kFloat)).");
  TORCH_CHECK(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(inv_scale.scalar_type() == at::kFloat, "inv_scale must be a float tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::kFloat, "found_inf must be a float tensor.");
}

// per_tensor (optional, sized like grads): set to 1 for each tensor holding a non-finite value.
void cpu_unscale(at::TensorList grads, at::Tensor& found_inf, float inv, std::vector<uint8_t>* per_tensor) {
  std::vector<detail::Span> spans;
  std::vector<size_t> tensor_of_span;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (original, dense copy) for strided grads
  spans.reserve(grads.size());
  int64_t total = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    if (g.numel() == 0) continue;
    at::Tensor dense = g;
    if (!g.is_non_overlapping_and_dense()) {
      // Rare (views with gaps): process a dense copy and write it back afterwards.
      dense = g.contiguous();
      copy_back.emplace_back(g, dense);
    }
    // A non-overlapping-and-dense tensor occupies exactly numel() consecutive elements from its
    // data pointer (in some permuted order), and the operation is elementwise, so order is irrelevant.
    spans.push_back({dense.data_ptr(), dense.numel(), dense.scalar_type()});
    tensor_of_span.push_back(i);
    total += dense.numel();
  }
  if (spans.empty()) return;

  struct Chunk {
    int32_t span;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  chunks.reserve(static_cast<size_t>(total / kChunk + spans.size()));
  for (size_t s = 0; s < spans.size(); ++s) {
    for (int64_t b = 0; b < spans[s].numel; b += kChunk) {
      chunks.push_back({static_cast<int32_t>(s), b, std::min(b + kChunk, spans[s].numel)});
    }
  }

  const detail::SpanKernel k = kernel();
  std::atomic<bool> found{false};
  // One flag per chunk, each written by the one thread that runs the chunk: which tensors overflowed
  // costs no extra pass (the numerics doctor's attribution reads it).
  std::vector<uint8_t> chunk_found(per_tensor ? chunks.size() : 0);
  auto work = [&](int64_t cb, int64_t ce) {
    bool local = false;
    for (int64_t c = cb; c < ce; ++c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      const bool bad = k(spans[static_cast<size_t>(ch.span)], ch.begin, ch.end, inv);
      if (bad && per_tensor) chunk_found[static_cast<size_t>(c)] = 1;
      local |= bad;
    }
    if (local) found.store(true, std::memory_order_relaxed);
  };
  const auto n = static_cast<int64_t>(chunks.size());
  if (total < kSerialBelow) {
    work(0, n);
  } else {
    detail::parallel_chunks(n, 1, work);
  }

  for (auto& [orig, dense] : copy_back) orig.copy_(dense);
  for (size_t c = 0; c < chunk_found.size(); ++c)
    if (chunk_found[c]) (*per_tensor)[tensor_of_span[static_cast<size_t>(chunks[c].span)]] = 1;
  // Only ever set, never cleared: the caller zeroes found_inf once for any number of calls.
  if (found.load()) found_inf.fill_(1.0);
}

void unscale_and_find_non_finite_(at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale,
                                  std::vector<uint8_t>* per_tensor, bool inv_scale_at_most_one = false) {
  if (scaled_grads.empty()) return;
  const at::Device device = scaled_grads[0].device();
  for (const auto& g : scaled_grads) {
    TORCH_CHECK(g.defined(), "non_finite_check_and_unscale_: got an undefined gradient tensor.");
    TORCH_CHECK(g.device() == device, "scaled_grads must be on the same device.");
    TORCH_CHECK(g.layout() == at::kStrided, "one of scaled_grads was not a strided tensor.");
    TORCH_CHECK(supported_dtype(g.scalar_type()), "non_finite_check_and_unscale_: gradient dtype ", g.scalar_type(),
                " is not supported; gradients must be float, double, bfloat16 or half.");
  }
  check_scalars(found_inf, inv_scale, device);

  if (device.is_cpu()) {
    // Read from memory, not with item(): the CPU kernel reads its own argument, and callers count item()
    // calls as the host reads that would synchronise a GPU (tests/scaling/fused_step_test.cpp).
    cpu_unscale(scaled_grads, found_inf, *inv_scale.data_ptr<float>(), per_tensor);
    return;
  }
#if AMPP_HAVE_ATEN_AMP_UNSCALE
  // CUDA (and other accelerator) builds: ATen's fused multi-tensor kernel, one call per dtype since
  // the foreach op requires a single dtype. The GPU suite runs it (tests/gpu).
  std::map<c10::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& g : scaled_grads) by_dtype[g.scalar_type()].push_back(g);
  const at::Tensor one = at::ones_like(inv_scale);
  for (auto& entry : by_dtype) {
    at::_amp_foreach_non_finite_check_and_unscale_(entry.second, found_inf, inv_scale);
    // ATen checks the inputs; check what was stored too (x * 1 rewrites nothing): see unscale.h. Where
    // |inv_scale| <= 1 the two checks agree, and the second pass is left out.
    if (!inv_scale_at_most_one) at::_amp_foreach_non_finite_check_and_unscale_(entry.second, found_inf, one);
  }
  // Which tensors overflowed: one check per tensor, only when something did (a skipped step).
  if (per_tensor && found_inf.item<float>() != 0.0f)
    for (size_t i = 0; i < scaled_grads.size(); ++i) (*per_tensor)[i] = has_non_finite({scaled_grads[i]});
#else
  TORCH_CHECK(false, "non_finite_check_and_unscale_: no kernel for device ", device,
              " in this LibTorch build; use CPU tensors or a LibTorch built with that backend.");
#endif
}

}  // namespace

void non_finite_check_and_unscale_(at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  unscale_and_find_non_finite_(scaled_grads, found_inf, inv_scale, nullptr);
}

void non_finite_check_and_unscale_(at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale,
                                   bool inv_scale_at_most_one) {
  unscale_and_find_non_finite_(scaled_grads, found_inf, inv_scale, nullptr, inv_scale_at_most_one);
}

void non_finite_check_and_unscale_(at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale,
                                   std::vector<uint8_t>& non_finite_per_tensor) {
  non_finite_per_tensor.assign(scaled_grads.size(), 0);
  unscale_and_find_non_finite_(scaled_grads, found_inf, inv_scale, &non_finite_per_tensor);
}

bool has_non_finite(at::TensorList tensors) {
  if (tensors.empty()) return false;
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(tensors[0].device());
  at::Tensor found = at::zeros({}, opts);
  non_finite_check_and_unscale_(tensors, found, at::ones({}, opts), /*inv_scale_at_most_one=*/true);
  return found.item<float>() != 0.0f;
}

const char* unscale_kernel_variant() { return kernel() == detail::unscale_span_default ? "default" : "avx2"; }

std::vector<std::string> unscale_kernel_variants() {
  std::vector<std::string> names{"default"};
  if (avx2_available()) names.emplace_back("avx2");
  return names;
}

bool set_unscale_kernel_variant(const std::string& name) {
  const detail::SpanKernel k = kernel_named(name);
  if (k == nullptr) return false;
  kernel_slot().store(k, std::memory_order_relaxed);
  return true;
}

}  // namespace ampp::numerics
