// Rounding to fp16/bf16 values while keeping float32 storage (the fp16-on-CPU emulation).

#include "detail.h"

#include <ampp/precision/rounding.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <unordered_map>

namespace ampp::precision {

// The casts are recorded by autograd, so backward rounds the incoming gradient the same way:
// d/dx of to(kHalf) casts the gradient to fp32, d/dx of to(kFloat) casts it to fp16 first.
at::Tensor round_to_fp16(const at::Tensor& t) { return t.to(at::kHalf).to(at::kFloat); }

at::Tensor round_to_bf16(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); }

namespace detail {
namespace {

// Same rule as LibTorch's autocast weight cache: only fp32 leaves that require grad (parameters)
// are cached; activations change every call. The weak reference guards against address reuse.
struct CacheEntry {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> source;
  at::Tensor rounded;
};
using Cache = std::unordered_map<c10::TensorImpl*, CacheEntry>;

Cache& fp16_cache() {
  thread_local Cache cache;
  return cache;
}

}  // namespace

void clear_fp16_cache() { fp16_cache().clear(); }

at::Tensor cached_round_to_fp16(const at::Tensor& t) {
  // Not under no_grad: a copy cached there has no autograd link, and a later grad-enabled use in the
  // same region would silently give the weight no gradient (pytorch/pytorch#65766).
  const bool cacheable = t.scalar_type() == at::kFloat && t.requires_grad() && t.is_leaf() && !t.is_view() &&
                         at::autocast::is_autocast_cache_enabled() && at::GradMode::is_enabled();
  if (!cacheable) return round_to_fp16(t);
  auto& cache = fp16_cache();
  auto it = cache.find(t.unsafeGetTensorImpl());
  if (it != cache.end() && !it->second.source.expired()) return it->second.rounded;
  at::Tensor rounded = round_to_fp16(t);
  cache.erase(t.unsafeGetTensorImpl());
  cache.emplace(
      t.unsafeGetTensorImpl(),
      CacheEntry{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()), rounded});
  return rounded;
}

}  // namespace detail
}  // namespace ampp::precision
