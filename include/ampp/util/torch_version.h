#pragma once
// The one place that reads LibTorch's version and whether it has CUDA. Version differences live in
// small per-layer compat headers that test AMPP_TORCH_AT_LEAST: src/ampp/<layer>/torch_compat.h
// (numerics, precision, scaling, dist, train) and include/ampp/util/optimizer_compat.h (public:
// optimizer state in headers).
#include <torch/version.h>

/// 1 when the LibTorch ampp is compiled against was built with CUDA (it ships ATen's CUDA headers), else 0:
/// whether the CUDA paths (autocast, graph capture, the GPU benchmark's memory statistics) compile at all.
#if __has_include(<ATen/cuda/CUDAConfig.h>)
#define AMPP_TORCH_HAS_CUDA 1
#else
#define AMPP_TORCH_HAS_CUDA 0
#endif

/// True when ampp is compiled against LibTorch `major.minor` or newer.
#define AMPP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
