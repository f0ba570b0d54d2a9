#pragma once
// BatchNorm's running statistics are updated by the forward pass, whether the step is then taken
// or skipped: a forward that overflowed leaves inf/NaN in them, and every later evaluation is NaN.
// The variance can also overflow (x*x) on a step whose loss and gradients stayed finite. BufferGuard
// keeps the values from before the forward and puts them back after any step whose buffers became
// non-finite. Finite buffers are kept as they are (PyTorch's semantics: a skipped step still updates
// the running statistics).
//
// Every step, with nothing read on the host (a CUDA graph captures it): the model's floating-point
// buffers are made views of one flat tensor per dtype and device, so that saving is one copy, and the
// check and the restore are a few kernels however many BatchNorm layers the model has (ResNet-50: 106
// buffers).
#include <torch/torch.h>

#include <vector>

namespace ampp::train::detail {

class BufferGuard {
 public:
  // Moves `model`'s floating-point buffers into flat storage (their values and tensor objects stay).
  explicit BufferGuard(torch::nn::Module& model);
  // Before the forward: a copy of every floating-point buffer (a few KB for BatchNorm). Buffers that
  // were given storage of their own since (Module::load, Module::to) are first moved back into the flat
  // storage: a host check of their data pointers.
  void save();
  // After the step: the saved values back where any buffer of a flat tensor is not finite, decided on
  // the device.
  void restore_where_non_finite();
  // Puts the saved values back (after a forward that must leave no trace, e.g. the doctor's replay).
  void restore();

 private:
  void flatten();
  bool still_flat() const;

  std::vector<std::vector<torch::Tensor>> groups_;  // the buffers, by dtype and device
  std::vector<torch::Tensor> flats_, saved_;        // one per group
};

}  // namespace ampp::train::detail
