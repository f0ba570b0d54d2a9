#include <ampp/train/batches.h>

namespace ampp::train {

BatchIterator::BatchIterator(const Dataset& dataset, std::vector<int64_t> indices, int64_t batch_size, bool drop_last)
    : dataset_(dataset), batch_size_(batch_size), drop_last_(drop_last) {
  TORCH_CHECK(batch_size > 0, "batch size must be positive, got ", batch_size);
  for (int64_t i : indices) {
    TORCH_CHECK(i >= 0 && i < dataset.size(), "sample index ", i, " is out of range for a dataset of ", dataset.size(),
                " samples");
  }
  indices_ = torch::tensor(indices, torch::kInt64).to(dataset.labels.device());  // where the data is
}

int64_t BatchIterator::num_batches() const {
  const int64_t n = indices_.numel();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

void BatchIterator::skip_to(int64_t batch_position) {
  TORCH_CHECK(batch_position >= 0 && batch_position <= num_batches(), "batch position ", batch_position,
              " is outside this epoch's ", num_batches(), " batches");
  position_ = batch_position;
}

std::optional<Batch> BatchIterator::next() {
  if (position_ >= num_batches()) return std::nullopt;
  const int64_t begin = position_ * batch_size_;
  const int64_t end = std::min<int64_t>(begin + batch_size_, indices_.numel());
  ++position_;
  auto idx = indices_.slice(0, begin, end);
  return Batch{dataset_.select(idx), dataset_.labels.index_select(0, idx)};
}

}  // namespace ampp::train
