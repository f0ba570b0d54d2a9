#pragma once
// The models `ampp train` can build by name: `mlp`, `cnn` (with BatchNorm, so O2's
// keep_batchnorm_fp32 matters) and a small `resnet` for 28x28 inputs, and the GPTs of gpt.h for text.
#include <torch/torch.h>

#include <string>
#include <vector>

namespace ampp::train {

// Common base so the trainer (and DDP) can hold any of them through one type. forward gives logits
// whose last dimension is the classes: [N, classes] for images, [N, T, vocabulary] for a GPT's tokens.
struct ClassifierImpl : torch::nn::Module {
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  // The submodules FSDP shards as units (ampp::dist::FullyShardedDataParallel): the ones forward() enters
  // through ampp::dist::unit_forward. Empty: the model is one unit.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() const { return {}; }
};

struct ModelOptions {
  TORCH_ARG(int64_t, in_channels) = 1;
  TORCH_ARG(int64_t, height) = 28;
  TORCH_ARG(int64_t, width) = 28;
  TORCH_ARG(int64_t, num_classes) = 10;
  // ampp::dist::SyncBatchNorm in place of BatchNorm2d (same parameter and buffer names).
  TORCH_ARG(bool, sync_batch_norm) = false;
  // cnn and resnet: the input, and so every activation, in channels-last (NHWC) order. LibTorch's CPU
  // kernels are vectorised over channels in that order: max_pool2d_with_indices (training's max-pool) is
  // 8x faster than in NCHW on 16x28x28 maps here. The
  // same computation; kernels may round differently. Parameters keep their layout.
  TORCH_ARG(bool, channels_last) = true;
  // GPTs only (gpt.h): the sequence length and the sizes; 0 keeps the preset's. num_classes is the data's
  // vocabulary, which must fit the preset's.
  TORCH_ARG(int64_t, context) = 0;
  TORCH_ARG(int64_t, n_layer) = 0;
  TORCH_ARG(int64_t, n_head) = 0;
  TORCH_ARG(int64_t, n_embd) = 0;
};

// Builds a freshly initialised model (parameters drawn from the global RNG, so seed it
// first). Throws c10::Error listing the known names for an unknown one.
std::shared_ptr<ClassifierImpl> make_model(const std::string& name, const ModelOptions& options = {});

const std::vector<std::string>& model_names();

}  // namespace ampp::train
