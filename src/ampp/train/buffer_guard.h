#pragma once
// BatchNorm's running statistics are updated by the forward pass, whether the step is then taken
// or skipped: a forward that overflowed leaves inf/NaN in them, and every later evaluation is NaN.
// The variance can also overflow (x*x) on a step whose loss and gradients stayed finite. BufferGuard
// keeps the values from before the forward and puts them back after any step whose buffers became
// non-finite. Finite buffers are kept as they are (PyTorch's semantics: a skipped step still updates
// the running statistics).
#include <torch/torch.h>

#include <vector>

namespace ampp::train::detail {

class BufferGuard {
 public:
  explicit BufferGuard(torch::nn::Module& model);
  // Before the forward: a copy of every floating-point buffer (a few KB for BatchNorm).
  void save();
  // After the step: restores the buffers if any of them is not finite; true if it did.
  bool restore_if_non_finite();
  // Puts the saved values back (after a forward that must leave no trace, e.g. the doctor's replay).
  void restore();

 private:
  std::vector<torch::Tensor> buffers_, saved_;
};

}  // namespace ampp::train::detail
