#include "buffer_guard.h"

#include <ampp/numerics/unscale.h>

namespace ampp::train::detail {

BufferGuard::BufferGuard(torch::nn::Module& model) {
  for (const auto& b : model.buffers()) {
    if (!b.is_floating_point()) continue;  // num_batches_tracked counts; it cannot overflow
    buffers_.push_back(b);
    saved_.push_back(torch::empty_like(b));
  }
}

void BufferGuard::save() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) saved_[i].copy_(buffers_[i]);
}

bool BufferGuard::restore_if_non_finite() {
  if (buffers_.empty() || !numerics::has_non_finite(buffers_)) return false;
  restore();
  return true;
}

void BufferGuard::restore() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(saved_[i]);
}

}  // namespace ampp::train::detail
