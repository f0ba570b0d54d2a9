#pragma once
// A BatchNorm that is not one of torch::nn::BatchNorm{1,2,3}d (ampp::dist::SyncBatchNorm) says so
// through this interface, so the layers below it treat it as BatchNorm (O2 keeps affine BatchNorm
// in FP32, as apex does for every subclass of torch.nn.modules.batchnorm._BatchNorm).
namespace ampp {

class BatchNormLike {
 public:
  virtual ~BatchNormLike() = default;
  // Has a learnable weight and bias.
  virtual bool is_affine() const = 0;
};

}  // namespace ampp
