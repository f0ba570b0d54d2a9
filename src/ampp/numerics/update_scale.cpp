// CPU implementation of aten::_amp_update_scale_ (1.13 has only the CUDA kernel); other devices are
// handed to ATen's op. Checks and messages follow ATen's.

#include <ampp/numerics/update_scale.h>

#include "torch_compat.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>

#if AMPP_HAVE_ATEN_AMP_UPDATE
#include <ATen/ops/_amp_update_scale.h>
#endif

namespace ampp::numerics {

at::Tensor& amp_update_scale_(at::Tensor& current_scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                              double growth_factor, double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(current_scale.defined() && growth_tracker.defined() && found_inf.defined(),
              "amp_update_scale_: current_scale, growth_tracker and found_inf must be defined tensors.");
  if (!current_scale.device().is_cpu()) {
#if AMPP_HAVE_ATEN_AMP_UPDATE
    // CUDA builds: ATen's single-thread kernel (the GPU suite runs it).
    return at::_amp_update_scale_(current_scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                                  growth_interval);
#else
    TORCH_CHECK(false, "amp_update_scale_: no kernel for device ", current_scale.device(),
                " in this LibTorch build; keep the scale on the CPU.");
#endif
  }
  TORCH_CHECK(growth_tracker.device().is_cpu(), "growth_tracker must be a CPU tensor.");
  TORCH_CHECK(found_inf.device().is_cpu(), "found_inf must be a CPU tensor.");
  TORCH_CHECK(current_scale.numel() == 1, "current_scale must be a 1-element tensor.");
  TORCH_CHECK(growth_tracker.numel() == 1, "growth_tracker must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(current_scale.scalar_type() == at::kFloat, "current_scale must be a float tensor.");
  TORCH_CHECK(growth_tracker.scalar_type() == at::kInt, "growth_tracker must be an int tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::kFloat, "found_inf must be a float tensor.");

  float* scale = current_scale.data_ptr<float>();
  int32_t* tracker = growth_tracker.data_ptr<int32_t>();
  if (*found_inf.data_ptr<float>() != 0.0f) {
    *scale = static_cast<float>(static_cast<double>(*scale) * backoff_factor);
    *tracker = 0;
  } else {
    const int32_t successful = *tracker + 1;
    if (successful == growth_interval) {
      // 1.13 grows even if the product is +inf; 2.1+ keeps the old scale then (torch_compat.h).
      const float grown = static_cast<float>(static_cast<double>(*scale) * growth_factor);
      if (!compat::kGrowthKeepsScaleFinite || std::isfinite(grown)) *scale = grown;
      *tracker = 0;
    } else {
      *tracker = successful;
    }
  }
  return current_scale;
}

}  // namespace ampp::numerics
