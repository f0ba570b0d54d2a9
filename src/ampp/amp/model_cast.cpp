#include "model_cast.h"

#include <ampp/precision/float8_linear.h>
#include <ampp/precision/rounding.h>
#include <ampp/util/batch_norm_like.h>

#include <torch/nn/modules/batchnorm.h>

#include <unordered_set>

namespace ampp::detail {

bool is_affine_batchnorm(const torch::nn::Module& module) {
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module)) return bn->options.affine();
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module)) return bn->options.affine();
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module)) return bn->options.affine();
  if (const auto* bn = dynamic_cast<const BatchNormLike*>(&module)) return bn->is_affine();
  return false;
}

namespace {

template <typename Fn>
void for_each_tensor(const std::vector<std::shared_ptr<torch::nn::Module>>& models, Fn&& fn) {
  for (const auto& model : models) {
    for (const auto& item : model->named_parameters(/*recurse=*/true)) fn(item.key(), item.value(), "parameter");
    for (const auto& item : model->named_buffers(/*recurse=*/true)) fn(item.key(), item.value(), "buffer");
  }
}

}  // namespace

c10::DeviceType model_device_type(const std::vector<std::shared_ptr<torch::nn::Module>>& models) {
  c10::optional<c10::Device> first;
  std::string first_name;
  for_each_tensor(models, [&](const std::string& name, const torch::Tensor& t, const char*) {
    if (!t.defined() || !t.is_floating_point()) return;
    if (!first) {
      first = t.device();
      first_name = name;
      return;
    }
    TORCH_CHECK(t.device().type() == first->type(),
                "ampp::initialize: the model's tensors live on different device "
                "types ('",
                first_name, "' on ", first->str(), ", '", name, "' on ", t.device().str(),
                "). Move the whole model to one device (model->to(device)) before initialize().");
  });
  TORCH_CHECK(first.has_value(),
              "ampp::initialize: the model has no floating-point parameters or buffers, so there "
              "is nothing to train in mixed precision. Pass the model whose parameters the optimizer updates.");
  return first->type();
}

void check_model_fp32(const std::vector<std::shared_ptr<torch::nn::Module>>& models) {
  for_each_tensor(models, [&](const std::string& name, const torch::Tensor& t, const char* kind) {
    if (!t.defined() || !t.is_floating_point()) return;
    TORCH_CHECK(t.scalar_type() == torch::kFloat, "ampp::initialize expects an FP32 model, but ", kind, " '", name,
                "' is ", c10::toString(t.scalar_type()),
                ". Do not cast the model yourself (no ->to(torch::kHalf)): "
                "initialize() casts it as the opt level requires. (Was initialize() already called on this model?)");
  });
}

std::vector<torch::Tensor> cast_model(torch::nn::Module& model, c10::ScalarType dtype, bool keep_batchnorm_fp32,
                                      bool emulate_fp16) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> cast_params;
  std::unordered_set<const c10::TensorImpl*> done;  // shared tensors are cast once
  auto cast_one = [&](torch::Tensor& t, bool is_param) {
    if (!t.defined() || !t.is_floating_point() || !done.insert(t.unsafeGetTensorImpl()).second) return;
    if (emulate_fp16) {
      t.copy_(precision::round_to_fp16(t));  // fp16 values in a float32 carrier
    } else {
      t.set_data(t.to(dtype));  // same TensorImpl: optimizers holding `t` see the cast tensor
    }
    if (is_param) {
      t.mutable_grad() = torch::Tensor();  // a grad of the old dtype would no longer match
      cast_params.push_back(t);
    }
  };
  for (const auto& module : model.modules(/*include_self=*/true)) {
    if (keep_batchnorm_fp32 && is_affine_batchnorm(*module)) continue;
    for (auto& item : module->named_parameters(/*recurse=*/false)) cast_one(item.value(), true);
    if (module->as<Float8LinearImpl>()) continue;  // its buffers are fp8 scaling state: float32, as TE's
    for (auto& item : module->named_buffers(/*recurse=*/false)) cast_one(item.value(), false);
  }
  return cast_params;
}

}  // namespace ampp::detail
