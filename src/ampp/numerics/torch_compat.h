#pragma once
// What the numerics layer follows from the LibTorch it is built against.
#include <ampp/util/torch_version.h>

namespace ampp::numerics::compat {

// _amp_update_scale_ grew the scale even when the product overflowed to +inf up to 2.0; 2.1
// keeps the old scale when the grown one is not finite. ampp follows the version it is built with.
constexpr bool kGrowthKeepsScaleFinite = AMPP_TORCH_AT_LEAST(2, 1);

}  // namespace ampp::numerics::compat
