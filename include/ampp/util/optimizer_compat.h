#pragma once
// Optimizer state keys and in-place zero_grad with one spelling for every supported LibTorch
// (1.13 and 2.x differ in both), and the tensors of a parameter's state; used by the opt-levels
// layer, the training report and by tests and user code alike.
#include <ampp/util/torch_version.h>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace ampp {

// LibTorch keys optimizer state by the parameter's TensorImpl: 1.13 by its address printed as a
// string (c10::guts::to_string), 2.x by the pointer itself (void*). The key type is read from
// Optimizer::state() so no version number has to be guessed.
using OptimizerState = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using OptimizerStateKey = OptimizerState::key_type;

template <typename Key = OptimizerStateKey>  // a template, so the branch not taken is not compiled
Key optimizer_state_key(const torch::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // what c10::guts::to_string (gone in 2.x) printed
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// Optimizer::zero_grad() wrote zeros into the grads up to 1.13; 2.0 made it set them to none by
// default (zero_grad(set_to_none = true)). This is the zero-writing form on every version.
inline void zero_grad_in_place(torch::optim::Optimizer& optimizer) {
#if AMPP_TORCH_AT_LEAST(2, 0)
  optimizer.zero_grad(/*set_to_none=*/false);
#else
  optimizer.zero_grad();
#endif
}

// Calls `visit` with each tensor of one parameter's state (SGD's momentum, Adam's and AdamW's moments,
// RMSprop's averages, Adagrad's sum; undefined ones too), which it may replace. LibTorch keeps the
// state in typed structs without a generic tensor list, so each optimizer is known by name: returns
// false, visiting nothing, for a state type it does not know.
bool for_each_state_tensor(torch::optim::OptimizerParamState& state, const std::function<void(torch::Tensor&)>& visit);

}  // namespace ampp
