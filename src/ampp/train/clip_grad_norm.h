#pragma once
// Internal to ampp: gradient clipping by the global L2 norm, as torch.nn.utils.clip_grad_norm_ computes it
// (one _foreach_norm over the gradients, the norm of the norms, one _foreach_mul_ by min(1, max/(norm+1e-6))),
// without the returned norm's host read: on a GPU two kernels for any number of parameters, not one per
// parameter.
#include <torch/types.h>

#include <vector>

namespace ampp::train::detail {

// The defined gradients of `params`, in their order (the ones clipping and the step's checks read).
std::vector<torch::Tensor> gradients_of(const std::vector<torch::Tensor>& params);

// Clips the gradients of `params` (those without one are left out) in place; nothing is read on the host.
void clip_grad_norm_on_device(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace ampp::train::detail
