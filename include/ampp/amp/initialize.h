#pragma once
// ampp::initialize: apex's amp.initialize(model, optimizer, opt_level) for LibTorch.
//
//   Net net;                                              // FP32 model on its device
//   torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   auto amp = ampp::initialize(net, opt, ampp::OptLevel::O2);   // or "O2", or Properties("O2").loss_scale(128)
//
// What it does, by level (docs/opt_levels.md has the table and the rules):
//   O0  nothing (FP32 baseline).
//   O1  nothing to the model; amp.autocast()/amp.forward() run the forward under ampp::autocast; dynamic
//       loss scaling.
//   O2  casts the model's floating-point parameters and buffers to the low dtype, except BatchNorm
//       (FP32; LibTorch's batch_norm takes the low-precision input and computes in FP32); replaces the
//       optimizer's low-precision params by FP32 master copies (optimizer state moves with them);
//       dynamic loss scaling.
//   O3  casts everything, no masters, no scaling.
//
// Call it once, before wrapping the model in DistributedDataParallel, with an FP32 model whose
// parameters all live on one device type and optimizers built from that model's parameters.

#include <ampp/amp/amp.h>
#include <ampp/amp/opt_level.h>
#include <ampp/amp/properties.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace ampp {

/// Several models and optimizers (apex accepts lists). Optimizers are referenced, not owned.
Amp initialize(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
               const std::vector<torch::optim::Optimizer*>& optimizers, Properties properties = {});

/// One model, one optimizer.
Amp initialize(const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
               Properties properties = {});

/// One model, no optimizer (inference: casts only).
Amp initialize(const std::shared_ptr<torch::nn::Module>& model, Properties properties = {});

/// TORCH_MODULE holders (Net net; ampp::initialize(net, opt, "O2")).
template <typename ModuleType>
Amp initialize(torch::nn::ModuleHolder<ModuleType>& model, torch::optim::Optimizer& optimizer,
               Properties properties = {}) {
  return initialize(std::static_pointer_cast<torch::nn::Module>(model.ptr()), optimizer, std::move(properties));
}

template <typename ModuleType>
Amp initialize(torch::nn::ModuleHolder<ModuleType>& model, Properties properties = {}) {
  return initialize(std::static_pointer_cast<torch::nn::Module>(model.ptr()), std::move(properties));
}

}  // namespace ampp
