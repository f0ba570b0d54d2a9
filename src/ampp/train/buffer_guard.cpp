#include "buffer_guard.h"

#include <map>
#include <utility>

namespace ampp::train::detail {
namespace {

// `buffers` (one dtype and device) become views of one new flat tensor holding their values: set_()
// keeps each tensor object, which the module, DDP and the optimizer-free code paths refer to.
torch::Tensor flatten_in_place(const std::vector<torch::Tensor>& buffers) {
  std::vector<torch::Tensor> values;
  for (const auto& b : buffers) values.push_back(b.contiguous().view(-1));
  torch::Tensor flat = torch::cat(values);
  int64_t offset = 0;
  for (auto b : buffers) {
    const auto sizes = b.sizes().vec();
    b.set_(flat.storage(), offset, sizes);  // contiguous
    offset += b.numel();
  }
  return flat;
}

}  // namespace

BufferGuard::BufferGuard(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  std::map<std::pair<std::string, c10::ScalarType>, std::vector<torch::Tensor>> groups;
  for (const auto& b : model.buffers()) {
    if (!b.is_floating_point() || b.numel() == 0) continue;  // num_batches_tracked counts; it cannot overflow
    groups[{b.device().str(), b.scalar_type()}].push_back(b);
  }
  for (auto& [key, buffers] : groups) groups_.push_back(std::move(buffers));
  flatten();
}

void BufferGuard::flatten() {
  torch::NoGradGuard no_grad;
  flats_.clear();
  saved_.clear();
  for (const auto& buffers : groups_) {
    flats_.push_back(flatten_in_place(buffers));
    saved_.push_back(torch::empty_like(flats_.back()));
  }
}

bool BufferGuard::still_flat() const {
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto* at = static_cast<const char*>(flats_[g].data_ptr());
    for (const auto& b : groups_[g]) {
      if (b.data_ptr() != at || b.device() != flats_[g].device() || b.scalar_type() != flats_[g].scalar_type())
        return false;
      at += b.numel() * b.element_size();
    }
  }
  return true;
}

void BufferGuard::save() {
  torch::NoGradGuard no_grad;
  if (!still_flat()) flatten();
  for (size_t i = 0; i < flats_.size(); ++i) saved_[i].copy_(flats_[i]);
}

void BufferGuard::restore_where_non_finite() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < flats_.size(); ++i)
    flats_[i].copy_(torch::where(torch::isfinite(flats_[i]).all(), flats_[i], saved_[i]));
}

void BufferGuard::restore() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < flats_.size(); ++i) flats_[i].copy_(saved_[i]);
}

}  // namespace ampp::train::detail
