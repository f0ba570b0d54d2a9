#pragma once
// A fast in-memory batch iterator over an index list (e.g. one rank's share from
// ampp::dist::DistributedSampler). No loader threads: a batch is one index_select on tensors
// that are already in memory, which costs microseconds next to a training step, and keeps
// the order fully deterministic.
#include <ampp/train/dataset.h>

#include <optional>
#include <vector>

namespace ampp::train {

struct Batch {
  torch::Tensor data;    // [B, C, H, W]
  torch::Tensor target;  // [B]
};

class BatchIterator {
 public:
  // `indices` are positions in `dataset`; batches are consecutive slices of it. With
  // drop_last the final short batch is skipped (as the seeds' DataLoader(drop_last=True)).
  BatchIterator(const Dataset& dataset, std::vector<int64_t> indices, int64_t batch_size, bool drop_last);

  // The next batch, or nullopt at the end of the index list.
  std::optional<Batch> next();

  int64_t num_batches() const;
  // Batches already returned; skip_to(k) makes next() return batch k (used by resume).
  int64_t position() const { return position_; }
  void skip_to(int64_t batch_position);

 private:
  const Dataset& dataset_;
  torch::Tensor indices_;  // int64
  int64_t batch_size_;
  bool drop_last_;
  int64_t position_ = 0;
};

}  // namespace ampp::train
