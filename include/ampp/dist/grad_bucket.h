#pragma once
// GradBucket: what a DDP communication hook sees (PyTorch's dist.GradBucket): one flat buffer
// holding the gradients of several parameters, plus where each one lives in it.
#include <cstddef>
#include <vector>

#include <torch/types.h>

namespace ampp::dist {

class GradBucket {
 public:
  GradBucket(size_t index, size_t bucket_count, torch::Tensor buffer, std::vector<size_t> offsets,
             std::vector<size_t> lengths, std::vector<torch::Tensor> parameters)
      : index_(index),
        bucket_count_(bucket_count),
        buffer_(std::move(buffer)),
        offsets_(std::move(offsets)),
        lengths_(std::move(lengths)),
        parameters_(std::move(parameters)) {}

  size_t index() const { return index_; }
  // Flat 1-D buffer. Without a hook DDP pre-divides it by the world size; with a hook it holds the
  // plain local gradients and the hook must average.
  torch::Tensor& buffer() { return buffer_; }
  const torch::Tensor& buffer() const { return buffer_; }
  void set_buffer(torch::Tensor buffer) { buffer_ = std::move(buffer); }
  // Per-parameter views into buffer(), shaped like the parameters.
  std::vector<torch::Tensor> gradients() const {
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < parameters_.size(); ++i)
      out.push_back(buffer_.narrow(0, static_cast<int64_t>(offsets_[i]), static_cast<int64_t>(lengths_[i]))
                        .view(parameters_[i].sizes()));
    return out;
  }
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }
  const std::vector<size_t>& offsets() const { return offsets_; }
  const std::vector<size_t>& lengths() const { return lengths_; }
  // The last bucket launched in an iteration.
  bool is_last() const { return index_ + 1 == bucket_count_; }

 private:
  size_t index_;
  size_t bucket_count_;
  torch::Tensor buffer_;
  std::vector<size_t> offsets_;
  std::vector<size_t> lengths_;
  std::vector<torch::Tensor> parameters_;
};

}  // namespace ampp::dist
