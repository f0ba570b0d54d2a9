#include <ampp/dist/sampler.h>

#include <torch/torch.h>

namespace ampp::dist {

DistributedSampler::DistributedSampler(size_t dataset_size, DistributedSamplerOptions options)
    : dataset_size_(dataset_size), options_(options), num_replicas_(options.num_replicas()), rank_(options.rank()) {
  if (num_replicas_ < 0 || rank_ < 0) {
    TORCH_CHECK(is_initialized(),
                "ampp::dist::DistributedSampler: num_replicas/rank not given and no default "
                "process group: call ampp::dist::init_process_group() first or pass "
                "DistributedSamplerOptions().num_replicas(R).rank(r).");
    if (num_replicas_ < 0) num_replicas_ = get_world_size();
    if (rank_ < 0) rank_ = get_rank();
  }
  TORCH_CHECK(num_replicas_ >= 1, "ampp::dist::DistributedSampler: num_replicas must be >= 1 (got ", num_replicas_,
              ").");
  TORCH_CHECK(rank_ >= 0 && rank_ < num_replicas_, "Invalid rank ", rank_, ", rank should be in the interval [0, ",
              num_replicas_ - 1, "]");
  compute_num_samples();
  reset();
  passes_->last_epoch.reset();  // the order made ready here is no pass yet: a loader's reset() is the first
}

DistributedSampler::DistributedSampler(size_t dataset_size, const ProcessGroup& group,
                                       DistributedSamplerOptions options)
    : DistributedSampler(dataset_size,
                         options.num_replicas(options.num_replicas() < 0 ? group.size() : options.num_replicas())
                             .rank(options.rank() < 0 ? group.rank() : options.rank())) {}

void DistributedSampler::compute_num_samples() {
  const auto n = static_cast<int64_t>(dataset_size_), r = num_replicas_;
  // drop_last with a remainder: floor(N / R) (PyTorch writes ceil((N - R) / R)); else ceil(N / R).
  num_samples_ = static_cast<size_t>((options_.drop_last() && n % r != 0) ? n / r : (n + r - 1) / r);
}

void DistributedSampler::set_epoch(int64_t epoch) { *epoch_ = epoch; }

std::vector<size_t> DistributedSampler::indices() const {
  const size_t n = dataset_size_, total = total_size();
  std::vector<size_t> all;
  all.reserve(std::max(n, total));
  if (options_.shuffle()) {
    // Same generator and kernel as torch.randperm(n, generator=g) with g.manual_seed(seed + epoch).
    auto gen = at::detail::createCPUGenerator(options_.seed() + static_cast<uint64_t>(*epoch_));
    const auto perm = torch::randperm(static_cast<int64_t>(n), gen, torch::kLong);
    const auto* p = perm.data_ptr<int64_t>();
    for (size_t i = 0; i < n; ++i) all.push_back(static_cast<size_t>(p[i]));
  } else {
    for (size_t i = 0; i < n; ++i) all.push_back(i);
  }
  if (total > n) {
    // Pad with the head of the list, repeating the whole list if the padding is longer than it.
    TORCH_CHECK(n > 0, "ampp::dist::DistributedSampler: dataset is empty; nothing to pad with.");
    for (size_t i = 0, pad = total - n; i < pad; ++i) all.push_back(all[i % n]);
  } else {
    all.resize(total);
  }
  std::vector<size_t> mine;
  mine.reserve(num_samples_);
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(num_replicas_))
    mine.push_back(all[i]);
  TORCH_INTERNAL_ASSERT(mine.size() == num_samples_);
  return mine;
}

// A pass (reset(): a DataLoader's epoch start) in the epoch of the pass before it, shuffling: set_epoch was
// forgotten and this epoch sees the previous one's order. Said once per epoch; indices() is a query and
// says nothing, however often it is asked.
void DistributedSampler::warn_if_the_order_repeats() const {
  if (!options_.shuffle() || passes_->last_epoch != *epoch_ || passes_->warned_epoch == *epoch_) return;
  passes_->warned_epoch = *epoch_;
  TORCH_WARN("ampp::dist::DistributedSampler: a new pass over the data in epoch ", *epoch_,
             " again, in the same order: call sampler.set_epoch(epoch) before each epoch (PyTorch's rule), or every "
             "epoch shuffles alike");
}

void DistributedSampler::reset(torch::optional<size_t> new_size) {
  if (new_size) {
    dataset_size_ = *new_size;
    compute_num_samples();
  }
  warn_if_the_order_repeats();
  passes_->last_epoch = *epoch_;
  current_ = indices();
  position_ = 0;
}

torch::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  if (position_ >= current_.size()) return torch::nullopt;
  const size_t end = std::min(current_.size(), position_ + batch_size);
  std::vector<size_t> batch(current_.begin() + static_cast<std::ptrdiff_t>(position_),
                            current_.begin() + static_cast<std::ptrdiff_t>(end));
  position_ = end;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", torch::tensor(*epoch_, torch::kLong), /*is_buffer=*/true);
  archive.write("sample_index", torch::tensor(static_cast<int64_t>(position_), torch::kLong), /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor epoch, index;
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("sample_index", index, /*is_buffer=*/true);
  *epoch_ = epoch.item<int64_t>();
  reset();
  position_ = std::min(static_cast<size_t>(index.item<int64_t>()), current_.size());
}

}  // namespace ampp::dist
