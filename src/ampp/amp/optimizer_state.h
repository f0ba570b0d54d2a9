#pragma once
// Per-parameter optimizer state follows its parameter when initialize() changes it: keyed by the
// TensorImpl address in LibTorch, so a master copy needs the entry re-keyed, and a cast parameter
// needs its state (momentum, Adam moments) in the parameter's dtype.

#include <ampp/util/optimizer_compat.h>

namespace ampp::detail {

/// LibTorch's state key for `param`.
inline auto state_key(const torch::Tensor& param) { return ampp::optimizer_state_key(param); }

/// Moves the state of `from` (if any) to `to` and casts its tensors to to's dtype.
void move_param_state(torch::optim::Optimizer& optimizer, const torch::Tensor& from, const torch::Tensor& to);

/// Casts the state of `param` (if any) to param's dtype (after the parameter itself was cast).
void cast_param_state(torch::optim::Optimizer& optimizer, const torch::Tensor& param);

}  // namespace ampp::detail
