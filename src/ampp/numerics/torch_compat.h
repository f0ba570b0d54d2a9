#pragma once
// What the numerics layer follows from the LibTorch it is built against.
#include <ampp/util/torch_version.h>

// ATen's own amp kernels, which ampp calls for tensors off the CPU (its CPU kernels are its own).
#if __has_include(<ATen/ops/_amp_update_scale.h>)
#define AMPP_HAVE_ATEN_AMP_UPDATE 1
#else
#define AMPP_HAVE_ATEN_AMP_UPDATE 0
#endif
#if __has_include(<ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>)
#define AMPP_HAVE_ATEN_AMP_UNSCALE 1
#else
#define AMPP_HAVE_ATEN_AMP_UNSCALE 0
#endif

namespace ampp::numerics::compat {

// _amp_update_scale_ grew the scale even when the product overflowed to +inf up to 2.0; 2.1
// keeps the old scale when the grown one is not finite. ampp follows the version it is built with.
constexpr bool kGrowthKeepsScaleFinite = AMPP_TORCH_AT_LEAST(2, 1);

}  // namespace ampp::numerics::compat
