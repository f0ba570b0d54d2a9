#pragma once
// The one place that reads LibTorch's version. Version differences live in small per-layer compat
// headers (precision/autocast_compat.h, dist/c10d_compat.h, ...) that test AMPP_TORCH_AT_LEAST.
#include <torch/version.h>

/// True when ampp is compiled against LibTorch `major.minor` or newer.
#define AMPP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
