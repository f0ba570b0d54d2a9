#pragma once
// The tensors an Amp handle's optimizers step, named after the model parameters they belong to: what a
// checkpoint in PyTorch's format stores as the model's float32 weights under O2.
#include <ampp/amp/amp.h>

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

namespace ampp::train {

/// The tensors the optimizer steps (the FP32 masters under O2, the parameters otherwise), each named
/// by the model parameter it belongs to, in the optimizer's order (Amp::master_params()): the model's order
/// for one param group, not for several (AdamW's decay and no-decay groups).
std::vector<std::pair<std::string, torch::Tensor>> named_master_params(const torch::nn::Module& model, const Amp& amp);

}  // namespace ampp::train
