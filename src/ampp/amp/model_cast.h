#pragma once
// Casting a model for O2/O3: every floating-point parameter and buffer goes to the low dtype,
// except those of affine BatchNorm modules when keep_batchnorm_fp32 (apex's convert_network).

#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <vector>

namespace ampp::detail {

/// torch::nn::BatchNorm{1,2,3}d or an ampp::BatchNormLike (SyncBatchNorm) with affine=true (apex keeps
/// exactly these in FP32).
bool is_affine_batchnorm(const torch::nn::Module& module);

/// The one device type all floating parameters/buffers of `models` live on; throws if mixed or none.
c10::DeviceType model_device_type(const std::vector<std::shared_ptr<torch::nn::Module>>& models);

/// Throws unless every floating-point parameter and buffer is float32 (apex: cast nothing yourself).
void check_model_fp32(const std::vector<std::shared_ptr<torch::nn::Module>>& models);

/// Casts in place (set_data, so optimizers keep seeing the same tensors) and drops their grads.
/// `emulate_fp16`: values are rounded to IEEE half but stay float32 (CPU has no fp16 kernels).
/// Returns the parameters that were cast.
std::vector<torch::Tensor> cast_model(torch::nn::Module& model, c10::ScalarType dtype, bool keep_batchnorm_fp32,
                                      bool emulate_fp16);

}  // namespace ampp::detail
