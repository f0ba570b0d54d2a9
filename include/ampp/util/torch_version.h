#pragma once
// The one place that reads LibTorch's version. Version differences live in small per-layer compat
// headers that test AMPP_TORCH_AT_LEAST: src/ampp/<layer>/torch_compat.h (numerics, precision, scaling,
// dist, train) and include/ampp/util/optimizer_compat.h (public: optimizer state in headers).
#include <torch/version.h>

/// True when ampp is compiled against LibTorch `major.minor` or newer.
#define AMPP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
