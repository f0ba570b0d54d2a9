#pragma once
// Private interface between the unscale dispatcher (unscale.cpp) and its ISA-specific kernels.

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace ampp::numerics::detail {

/// A dense run of `numel` elements of one dtype (a contiguous or non-overlapping-and-dense tensor).
struct Span {
  void* data;
  int64_t numel;
  c10::ScalarType dtype;
};

/// Unscales elements [begin, end) of `span` in place; returns true if any of them was non-finite.
using SpanKernel = bool (*)(const Span& span, int64_t begin, int64_t end, float inv_scale);

bool unscale_span_default(const Span& span, int64_t begin, int64_t end, float inv_scale);
bool unscale_span_avx2(const Span& span, int64_t begin, int64_t end, float inv_scale);  // if AMPP_UNSCALE_HAVE_AVX2

}  // namespace ampp::numerics::detail
