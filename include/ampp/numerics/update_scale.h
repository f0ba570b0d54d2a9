#pragma once
// ampp's CPU implementation of aten::_amp_update_scale_ (missing on CPU in LibTorch 1.13).

#include <ATen/core/Tensor.h>

namespace ampp::numerics {

/// The growth-tracker rule of PyTorch 1.13, in place:
///   found_inf != 0: scale *= backoff_factor, growth_tracker = 0
///   otherwise:      if growth_tracker + 1 == growth_interval: scale *= growth_factor, growth_tracker = 0
///                   else growth_tracker += 1
/// Products are formed in double and stored as float (as in ATen). Like 1.13 (not 2.1+), growth is
/// not suppressed when it overflows to +inf. current_scale, found_inf: float32, 1 element;
/// growth_tracker: int32, 1 element; all on one device. Returns current_scale.
at::Tensor& amp_update_scale_(at::Tensor& current_scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                              double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace ampp::numerics
