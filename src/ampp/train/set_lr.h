#pragma once
// Internal to ampp: the trainer's learning rate, written into its optimizer.
#include <torch/optim/optimizer.h>

namespace ampp::train::detail {

// Every param group's learning rate (the trainer's optimizer: SGD or AdamW, plain, fused or ZeRO's).
inline void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace ampp::train::detail
