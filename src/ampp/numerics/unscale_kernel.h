#pragma once
// The per-span CPU kernel of non_finite_check_and_unscale_. This header is compiled once per ISA
// variant (unscale_kernel_<variant>.cpp sets CPU_CAPABILITY and the -m flags, as ATen does for its own
// kernels) and must only be included there. Each variant exports one entry point, AMPP_UNSCALE_ENTRY.
//
// Non-finite detection without branches: for finite x, x - x == +0 exactly; for +-inf and NaN it is
// NaN. Summing (x - x) over a span therefore yields NaN iff the span holds a non-finite value, at the
// cost of one sub + one add per vector, fused with the multiply by inv_scale in the same pass.
//
// What is checked is what the optimizer will read: the unscaled values as stored. With |inv_scale| <= 1
// that is the same as checking the inputs (rounding is monotone, so |x * inv| <= |x| stays finite and
// inf * inv stays inf or NaN), which costs nothing extra. With |inv_scale| > 1 (a scale below 1) a
// finite gradient can overflow when unscaled (4 * 2^126 in fp32, 60000 * 2 in fp16); PyTorch checks the
// inputs only and steps on the inf. There the kernel checks the stored results (kCheckStored).

#include "unscale_span.h"

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>

#if defined(AMPP_UNSCALE_F16C)
#include <immintrin.h>
#endif

namespace {

using at::vec::Vectorized;

template <typename V>
bool any_nan(const V& acc) {
  using T = typename V::value_type;
  __at_align__ T lanes[V::size()];
  acc.store(lanes);
  bool nan = false;
  for (int64_t k = 0; k < V::size(); ++k) nan |= (lanes[k] != lanes[k]);
  return nan;
}

// float and double: opmath type == storage type.
template <typename T, bool kWrite, bool kCheckStored>
bool span_full(T* p, int64_t n, T inv) {
  using V = Vectorized<T>;
  constexpr int64_t W = V::size();
  const V vinv(inv);
  V acc0(T(0)), acc1(T(0));
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const V a = V::loadu(p + i), b = V::loadu(p + i + W);
    if constexpr (kWrite) {
      const V ya = a * vinv, yb = b * vinv;
      ya.store(p + i);
      yb.store(p + i + W);
      acc0 = acc0 + (kCheckStored ? ya - ya : a - a);
      acc1 = acc1 + (kCheckStored ? yb - yb : b - b);
    } else {
      acc0 = acc0 + (a - a);
      acc1 = acc1 + (b - b);
    }
  }
  bool bad = any_nan(acc0 + acc1);
  for (; i < n; ++i) {
    const T v = p[i];
    if constexpr (kWrite) p[i] = v * inv;
    bad |= !std::isfinite(kCheckStored ? p[i] : v);
  }
  return bad;
}

// bfloat16: widen to fp32, multiply in fp32, round back to nearest even. A float product just below
// FLT_MAX rounds to inf in bf16, so the stored check re-widens what was stored.
template <bool kWrite, bool kCheckStored>
bool span_bf16(c10::BFloat16* p, int64_t n, float inv) {
  using B = Vectorized<c10::BFloat16>;
  using F = Vectorized<float>;
  constexpr int64_t W = B::size();
  const F vinv(inv);
  F acc0(0.f), acc1(0.f);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    F a, b;
    std::tie(a, b) = at::vec::convert_bfloat16_float(B::loadu(p + i));
    if constexpr (kWrite) {
      const B stored = at::vec::convert_float_bfloat16(a * vinv, b * vinv);
      stored.store(p + i);
      if constexpr (kCheckStored) std::tie(a, b) = at::vec::convert_bfloat16_float(stored);
    }
    acc0 = acc0 + (a - a);
    acc1 = acc1 + (b - b);
  }
  bool bad = any_nan(acc0 + acc1);
  for (; i < n; ++i) {
    const float v = static_cast<float>(p[i]);
    if constexpr (kWrite) p[i] = c10::BFloat16(v * inv);
    bad |= !std::isfinite(kCheckStored ? static_cast<float>(p[i]) : v);
  }
  return bad;
}

// half: F16C conversions where the variant has them, else c10's scalar conversion.
template <bool kWrite, bool kCheckStored>
bool span_half(c10::Half* p, int64_t n, float inv) {
  int64_t i = 0;
  bool bad = false;
#if defined(AMPP_UNSCALE_F16C)
  const __m256 vinv = _mm256_set1_ps(inv);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
    if constexpr (kWrite) {
      const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(x, vinv), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i), h);
      if constexpr (kCheckStored) x = _mm256_cvtph_ps(h);
    }
    acc = _mm256_add_ps(acc, _mm256_sub_ps(x, x));
  }
  bad = any_nan(Vectorized<float>(acc));
#endif
  for (; i < n; ++i) {
    const float v = static_cast<float>(p[i]);
    if constexpr (kWrite) p[i] = c10::Half(v * inv);
    bad |= !std::isfinite(kCheckStored ? static_cast<float>(p[i]) : v);
  }
  return bad;
}

template <bool kWrite, bool kCheckStored>
bool span_dispatch(const ampp::numerics::detail::Span& s, int64_t begin, int64_t end, float inv) {
  const int64_t n = end - begin;
  switch (s.dtype) {
    case c10::ScalarType::Float:
      return span_full<float, kWrite, kCheckStored>(static_cast<float*>(s.data) + begin, n, inv);
    case c10::ScalarType::Double:
      return span_full<double, kWrite, kCheckStored>(static_cast<double*>(s.data) + begin, n, double(inv));
    case c10::ScalarType::BFloat16:
      return span_bf16<kWrite, kCheckStored>(static_cast<c10::BFloat16*>(s.data) + begin, n, inv);
    case c10::ScalarType::Half:
      return span_half<kWrite, kCheckStored>(static_cast<c10::Half*>(s.data) + begin, n, inv);
    default:
      return false;  // unreachable: dtypes are validated before any kernel runs
  }
}

}  // namespace

namespace ampp::numerics::detail {

bool AMPP_UNSCALE_ENTRY(const Span& span, int64_t begin, int64_t end, float inv_scale) {
  // inv_scale == 1 leaves every value as is (x * 1 == x, also for inf/NaN): check only, no stores.
  if (inv_scale == 1.0f) return span_dispatch<false, false>(span, begin, end, inv_scale);
  // Written so that a NaN inv_scale takes the stored check too.
  const bool can_overflow = !(std::fabs(inv_scale) <= 1.0f);
  return can_overflow ? span_dispatch<true, true>(span, begin, end, inv_scale)
                      : span_dispatch<true, false>(span, begin, end, inv_scale);
}

}  // namespace ampp::numerics::detail
