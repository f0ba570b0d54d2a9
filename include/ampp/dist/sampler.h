#pragma once
// DistributedSampler: the index sequence of torch.utils.data.distributed.DistributedSampler, bit for
// bit (shuffle = torch::randperm with a CPU generator seeded seed + epoch; pad by repeating the
// head of the permutation or drop the tail; rank r takes every R-th index starting at r).
// LibTorch's own DistributedRandomSampler differs (std::shuffle by epoch, contiguous blocks).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <torch/arg.h>
#include <torch/data/samplers/base.h>

#include <ampp/dist/process_group.h>

namespace ampp::dist {

struct DistributedSamplerOptions {
  // -1: take them from the default process group (as PyTorch does).
  TORCH_ARG(int64_t, num_replicas) = -1;
  TORCH_ARG(int64_t, rank) = -1;
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(bool, drop_last) = false;
};

class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  explicit DistributedSampler(size_t dataset_size, DistributedSamplerOptions options = {});
  DistributedSampler(size_t dataset_size, const ProcessGroup& group, DistributedSamplerOptions options = {});

  // Only stores the epoch (as PyTorch); the order changes at the next reset()/indices(). Copies share
  // the epoch: LibTorch's make_data_loader keeps a copy of the sampler it is given, and
  // sampler.set_epoch(e) on the caller's object must reach that copy, as in Python, where the
  // DataLoader holds the same sampler object (otherwise every epoch would shuffle alike).
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return *epoch_; }

  // This rank's indices for the current epoch (PyTorch's list(iter(sampler))); a query, as often as needed.
  std::vector<size_t> indices() const;
  // num_samples: per-rank length (PyTorch's len(sampler)); total_size = num_samples * num_replicas.
  size_t size() const { return num_samples_; }
  size_t total_size() const { return num_samples_ * static_cast<size_t>(num_replicas_); }
  const DistributedSamplerOptions& options() const { return options_; }

  // torch::data::samplers::Sampler interface (DataLoader calls reset() at each epoch start: a new pass). A
  // shuffling sampler's second pass in one epoch warns, once per epoch: set_epoch(epoch) was forgotten, and
  // every epoch would see the same order (PyTorch stays silent).
  void reset(torch::optional<size_t> new_size = torch::nullopt) override;
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void compute_num_samples();
  void warn_if_the_order_repeats() const;
  size_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t num_replicas_;
  int64_t rank_;
  std::shared_ptr<int64_t> epoch_ = std::make_shared<int64_t>(0);  // shared by copies (set_epoch)
  // The epoch of the last pass (reset()) and the last epoch the warning above was given in, shared as the
  // epoch is (a loader's copy resets).
  struct Passes {
    std::optional<int64_t> last_epoch;
    std::optional<int64_t> warned_epoch;
  };
  std::shared_ptr<Passes> passes_ = std::make_shared<Passes>();
  size_t num_samples_ = 0;
  std::vector<size_t> current_;
  size_t position_ = 0;
};

}  // namespace ampp::dist
