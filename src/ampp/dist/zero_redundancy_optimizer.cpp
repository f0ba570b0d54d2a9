// ZeroRedundancyOptimizer: the partition, the sharded step with its broadcasts, and checkpoints that
// move shards between ranks as archives of the wrapped optimizer.
#include <ampp/dist/reducer.h>
#include <ampp/dist/zero_redundancy_optimizer.h>
#include <ampp/io/archive_reader.h>
#include <ampp/numerics/unscale.h>
#include <ampp/util/archive_bytes.h>
#include <ampp/util/atomic_file.h>
#include <ampp/util/optimizer_compat.h>

#include <torch/torch.h>

#include "control_tensors.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace ampp::dist {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamGroup;

std::string optimizer_bytes(const Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  return archive_bytes(archive);
}

std::vector<torch::Tensor> params_of(const std::vector<OptimizerParamGroup>& groups) {
  std::vector<torch::Tensor> params;
  for (const auto& g : groups) params.insert(params.end(), g.params().begin(), g.params().end());
  return params;
}

void load_archive_bytes(Optimizer& optimizer, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  optimizer.load(archive);
}

// Moves the state of `params` from `from` to `to` (both key it by the same parameter tensors).
void move_state(Optimizer& from, Optimizer& to, const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) {
    auto it = from.state().find(optimizer_state_key(p));
    if (it == from.state().end()) continue;  // never stepped: no state yet
    to.state()[optimizer_state_key(p)] = std::move(it->second);
    from.state().erase(it);
  }
}

// The options of `from`'s groups, copied into `to`'s (same number of groups).
void copy_group_options(const std::vector<OptimizerParamGroup>& from, std::vector<OptimizerParamGroup>& to) {
  for (size_t g = 0; g < from.size(); ++g) to[g].set_options(from[g].options().clone());
}

// Rank `to` receives every rank's bytes (one gather of padded byte tensors; sizes first), sent as tensors on
// `device` (detail::control_device: the parameters' GPU for an NCCL group).
std::vector<std::string> gather_bytes(const ProcessGroup& group, const std::string& mine, int to,
                                      const torch::Device& device) {
  const auto on = torch::TensorOptions(torch::kLong).device(device);
  auto size = torch::full({1}, static_cast<int64_t>(mine.size()), on);
  std::vector<torch::Tensor> sizes(group.size());
  for (auto& s : sizes) s = torch::empty({1}, on);
  std::vector<std::vector<torch::Tensor>> size_out{sizes};
  std::vector<torch::Tensor> size_in{size};
  group.c10d()->allgather(size_out, size_in)->wait();
  const auto all_sizes = torch::cat(size_out[0]).cpu();
  const int64_t longest = all_sizes.max().item<int64_t>();

  auto padded = torch::zeros({longest}, torch::kByte);
  std::memcpy(padded.data_ptr(), mine.data(), mine.size());
  std::vector<std::vector<torch::Tensor>> out;
  if (group.rank() == to) {
    out.emplace_back();
    for (int r = 0; r < group.size(); ++r) out[0].push_back(torch::empty({longest}, on.dtype(torch::kByte)));
  }
  std::vector<torch::Tensor> in{padded.to(device)};
  c10d::GatherOptions options;
  options.rootRank = to;
  group.c10d()->gather(out, in, options)->wait();
  std::vector<std::string> result;
  if (group.rank() != to) return result;
  for (int r = 0; r < group.size(); ++r) {
    const auto bytes = out[0][r].cpu();
    result.emplace_back(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(all_sizes[r].item<int64_t>()));
  }
  return result;
}

// Where the parameters live (the first one's device; the CPU when there are none).
torch::Device parameters_device(const std::vector<OptimizerParamGroup>& groups) {
  for (const auto& g : groups)
    if (!g.params().empty()) return g.params().front().device();
  return torch::kCPU;
}

std::unique_ptr<torch::optim::OptimizerOptions> defaults_of(const OptimizerFactory& factory) {
  TORCH_CHECK(factory,
              "ZeroRedundancyOptimizer: the optimizer factory is empty; pass a function that builds the "
              "wrapped optimizer, e.g. ZeroRedundancyOptimizer::factory_of<torch::optim::Adam>(options)");
  return factory({})->defaults().clone();
}

}  // namespace

std::vector<int> assign_parameters_to_ranks(const std::vector<OptimizerParamGroup>& groups, int world_size) {
  TORCH_CHECK(world_size >= 1, "assign_parameters_to_ranks: world_size must be >= 1, got ", world_size);
  std::vector<int> owners;
  std::vector<int64_t> held(static_cast<size_t>(world_size), 0);
  for (const auto& group : groups) {
    const auto& params = group.params();
    std::vector<size_t> order(params.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
    std::vector<int> group_owners(params.size());
    for (size_t i : order) {
      const auto rank = std::min_element(held.begin(), held.end()) - held.begin();  // first of the least loaded
      group_owners[i] = static_cast<int>(rank);
      held[static_cast<size_t>(rank)] += params[i].numel();
    }
    owners.insert(owners.end(), group_owners.begin(), group_owners.end());
  }
  return owners;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(const std::vector<OptimizerParamGroup>& groups,
                                                 OptimizerFactory factory, ZeroRedundancyOptimizerOptions options)
    : Optimizer(groups, defaults_of(factory)),
      group_(options.process_group() ? *options.process_group() : default_group()),
      factory_(std::move(factory)),
      options_(std::move(options)) {
  TORCH_CHECK(options_.broadcast_bucket_mb() > 0, "ZeroRedundancyOptimizer: broadcast_bucket_mb must be > 0, got ",
              options_.broadcast_bucket_mb());
  owners_ = assign_parameters_to_ranks(param_groups_, group_.size());
  for (int r = 0; r < group_.size(); ++r) shared_by_owner_.push_back(params_of(groups_of_rank(r)));
  auto mine = groups_of_rank(group_.rank());
  local_ = factory_(mine);
  TORCH_CHECK(local_ && local_->param_groups().size() == mine.size(),
              "ZeroRedundancyOptimizer: the factory must build an optimizer over exactly the groups it is given (",
              mine.size(), "), got ", local_ ? local_->param_groups().size() : 0);
}

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizer::groups_of_rank(int rank) const {
  std::vector<OptimizerParamGroup> out;
  size_t index = 0;
  for (const auto& group : param_groups_) {
    std::vector<torch::Tensor> params;
    for (const auto& p : group.params()) {
      if (owners_[index++] == rank) params.push_back(p);
    }
    out.emplace_back(std::move(params), group.options().clone());
  }
  return out;
}

void ZeroRedundancyOptimizer::sync_options_to_local() { copy_group_options(param_groups_, local_->param_groups()); }

torch::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  TORCH_CHECK(!closure,
              "ZeroRedundancyOptimizer::step: a closure is not supported (each rank steps a different shard, so "
              "a closure would be evaluated once per rank on partial parameters); compute the loss before step()");
  TORCH_CHECK(param_groups_.size() == local_->param_groups().size(),
              "ZeroRedundancyOptimizer: param groups were added after construction (", param_groups_.size(), " vs ",
              local_->param_groups().size(), "); build a new ZeroRedundancyOptimizer over all groups instead");
  sync_options_to_local();
  step_local();
  if (after_local_step_) after_local_step_();
  broadcast_parameters();
  return {};
}

// The scale, skip flag and lr tensor set for this step (GradScaleAwareOptimizer) go to a fused local
// optimizer as they are: the skip is decided on the device. A plain one gets what GradScaler's own path
// would do for it. Every rank sees the same flag (the gradients were averaged first), so every rank skips
// alike and the broadcast after it stays collective.
void ZeroRedundancyOptimizer::step_local() {
  torch::NoGradGuard no_grad;
  if (auto* fused = dynamic_cast<GradScaleAwareOptimizer*>(local_.get())) {
    const auto device = parameters_device(param_groups_);
    fused->set_grad_scaling(grad_scale_on(device).value_or(torch::Tensor()),
                            found_inf_on(device).value_or(torch::Tensor()));
    fused->set_lr_tensor(lr_tensor());
    local_->step();
  } else {
    step_plain_local();
  }
  end_of_step();
}

// A plain local optimizer: the skip flag and a tensor lr are read on the host, the shard's gradients
// divided by the scale here.
void ZeroRedundancyOptimizer::step_plain_local() {
  const auto params = local_parameters();
  if (params.empty()) return;  // more ranks than parameters: this rank owns none
  const auto device = params.front().device();
  if (const auto found_inf = found_inf_on(device); found_inf && found_inf->item<float>() != 0.0F) return;
  if (const auto scale = grad_scale_on(device)) {
    std::vector<torch::Tensor> grads;
    for (const auto& p : params)
      if (p.grad().defined()) grads.push_back(p.grad());
    // GradScaler.unscale_'s inverse and kernel; the flag was decided already (found_inf above).
    auto unused_flag = torch::zeros({1}, scale->options().dtype(torch::kFloat));
    numerics::non_finite_check_and_unscale_(grads, unused_flag,
                                            scale->to(torch::kDouble).reciprocal().to(torch::kFloat));
  }
  if (lr_tensor().defined()) {
    const double lr = lr_tensor().item<double>();
    for (auto& group : local_->param_groups()) group.options().set_lr(lr);
  }
  local_->step();
}

void ZeroRedundancyOptimizer::set_broadcast_group(const ProcessGroup& group) {
  TORCH_CHECK(group && group.size() == group_.size() && group.rank() == group_.rank(),
              "ZeroRedundancyOptimizer::set_broadcast_group: the group must hold the optimizer's ranks in the same "
              "order (",
              group_.size(), " ranks, this one ", group_.rank(), "), got ",
              group ? std::to_string(group.size()) + " ranks, this one " + std::to_string(group.rank()) : "none",
              "; make it with dist::new_group over every rank of the optimizer's group");
  broadcast_group_ = group;
}

void ZeroRedundancyOptimizer::broadcast_parameters() {
  const auto bucket_bytes = static_cast<int64_t>(options_.broadcast_bucket_mb() * 1024 * 1024);
  const ProcessGroup& group = broadcast_group_ ? *broadcast_group_ : group_;
  for (int r = 0; r < group.size(); ++r) {
    broadcast_coalesced(group, shared_by_owner_[static_cast<size_t>(r)], bucket_bytes, r);
  }
}

std::vector<torch::Tensor> ZeroRedundancyOptimizer::local_parameters() const {
  return params_of(local_->param_groups());
}

bool ZeroRedundancyOptimizer::steps_locally(const torch::Tensor& param) const {
  const auto local = local_parameters();
  return std::any_of(local.begin(), local.end(), [&](const torch::Tensor& p) { return p.is_same(param); });
}

void ZeroRedundancyOptimizer::use_master(const torch::Tensor& param, const torch::Tensor& master) {
  TORCH_CHECK(steps_locally(param), "ZeroRedundancyOptimizer::use_master: the parameter of shape ", param.sizes(),
              " belongs to another rank's shard");
  const auto same = [&](torch::Tensor& p) {
    if (p.is_same(param)) p = master;
  };
  for (auto& group : local_->param_groups()) std::for_each(group.params().begin(), group.params().end(), same);
  for (auto& group : param_groups_) std::for_each(group.params().begin(), group.params().end(), same);
  auto it = local_->state().find(optimizer_state_key(param));
  if (it != local_->state().end()) {
    auto state = std::move(it->second);
    local_->state().erase(it);
    local_->state()[optimizer_state_key(master)] = std::move(state);
  }
}

void ZeroRedundancyOptimizer::set_after_local_step(std::function<void()> copy_masters_to_model) {
  after_local_step_ = std::move(copy_masters_to_model);
}

void ZeroRedundancyOptimizer::set_join_mode(const JoinOptions*) {}  // nothing to announce: DDP's round does

int ZeroRedundancyOptimizer::shadow_iteration() {
  broadcast_parameters();  // the active ranks' step: their shards in, this rank's (unchanged) shard out
  return 1;
}

void ZeroRedundancyOptimizer::finish_join(bool) {}  // the parameters are the model's: DDP's finish shares them

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  TORCH_CHECK(to >= 0 && to < group_.size(), "consolidate_state_dict: rank ", to, " is not in the group (ranks 0..",
              group_.size() - 1, ")");
  sync_options_to_local();
  const auto shards = gather_bytes(group_, optimizer_bytes(*local_), to,
                                   detail::control_device(group_, parameters_device(param_groups_)));
  consolidated_.reset();
  if (group_.rank() != to) return;
  auto full = factory_(param_groups_);
  for (int r = 0; r < group_.size(); ++r) {
    auto groups = groups_of_rank(r);
    auto shard = factory_(groups);
    load_archive_bytes(*shard, shards[static_cast<size_t>(r)]);
    for (const auto& g : groups) move_state(*shard, *full, g.params());
  }
  consolidated_ = std::move(full);
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  TORCH_CHECK(consolidated_, "ZeroRedundancyOptimizer::save on rank ", group_.rank(),
              ": no consolidated state here. Call consolidate_state_dict(to) on every rank first, then save on "
              "rank `to` (or use save_consolidated(path), which does both); save_shard(path) saves this rank's "
              "shard alone");
  consolidated_->save(archive);
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  auto full = factory_(param_groups_);
  full->load(archive);  // LibTorch checks the group and parameter counts
  load_from(*full);
}

void ZeroRedundancyOptimizer::load_from(Optimizer& unsharded) {
  TORCH_CHECK(unsharded.param_groups().size() == param_groups_.size(),
              "ZeroRedundancyOptimizer::load_from: ", unsharded.param_groups().size(),
              " param groups, this optimizer has ", param_groups_.size());
  move_state(unsharded, *local_, local_parameters());
  copy_group_options(unsharded.param_groups(), param_groups_);
  sync_options_to_local();
}

void ZeroRedundancyOptimizer::save_consolidated(const std::string& path, int to) {
  consolidate_state_dict(to);
  if (group_.rank() == to) {
    write_file_atomic(path, optimizer_bytes(*consolidated_));
    consolidated_.reset();  // the whole state is only needed while it is written
  }
}

torch::Tensor ZeroRedundancyOptimizer::owners_tensor() const {
  return torch::tensor(std::vector<int64_t>(owners_.begin(), owners_.end()));
}

void ZeroRedundancyOptimizer::save_shard(const std::string& path) const {
  torch::serialize::OutputArchive archive, local;
  local_->save(local);
  archive.write("world_size", torch::tensor(static_cast<int64_t>(group_.size())));
  archive.write("rank", torch::tensor(static_cast<int64_t>(group_.rank())));
  archive.write("owners", owners_tensor());
  archive.write("local_optimizer", local);
  save_archive_atomic(archive, path);
}

void ZeroRedundancyOptimizer::load_shard(const std::string& path) {
  torch::serialize::InputArchive archive, local;
  // Untrusted bytes: ampp's reader, never torch::jit::load; onto this rank's device, not the saving rank's.
  const auto mine = local_parameters();
  read_archive_file(archive, path, mine.empty() ? std::nullopt : std::optional<c10::Device>(mine.front().device()));
  torch::Tensor world, rank, owners;
  archive.read("world_size", world);
  archive.read("rank", rank);
  archive.read("owners", owners);
  TORCH_CHECK(world.item<int64_t>() == group_.size() && rank.item<int64_t>() == group_.rank(), "load_shard: '", path,
              "' is the shard of rank ", rank.item<int64_t>(), " of ", world.item<int64_t>(), ", this is rank ",
              group_.rank(), " of ", group_.size(),
              ". Shards only fit the same world size and rank; to change the world size, save with "
              "save_consolidated() and load() the consolidated file on every rank");
  TORCH_CHECK(torch::equal(owners, owners_tensor()), "load_shard: '", path,
              "' was saved with another partition of the parameters (different parameters or groups)");
  archive.read("local_optimizer", local);
  local_->load(local);
  copy_group_options(local_->param_groups(), param_groups_);
}

}  // namespace ampp::dist
