// FullyShardedDataParallel's checkpoints: the full state dict (every shard gathered; what torch.load and
// an unsharded model read) and one file per rank holding its shards (same world size and rank only).
#include <ampp/amp/pytorch_checkpoint.h>
#include <ampp/util/archive_bytes.h>

#include <torch/serialize.h>

#include <fstream>
#include <set>
#include <sstream>

#include "fsdp_state.h"

namespace ampp::dist {
namespace {

// The whole FP32 parameter from every rank's padded chunk.
torch::Tensor gather_full(const ProcessGroup& group, const detail::ShardedParam& p) {
  const int world = group.size();
  auto all = torch::empty({world * p.rows_per_rank, p.row_numel}, p.padded.options());
  if (world == 1) {
    all.copy_(p.padded.reshape({p.rows_per_rank, p.row_numel}));
  } else {
    std::vector<std::vector<torch::Tensor>> out{all.chunk(world, 0)};
    std::vector<torch::Tensor> in{p.padded.reshape({p.rows_per_rank, p.row_numel})};
    group.c10d()->allgather(out, in)->wait();
  }
  return all.narrow(0, 0, p.rows).reshape(p.param.sizes()).cpu();
}

}  // namespace

c10::impl::GenericDict FullyShardedDataParallel::full_state_dict() const {
  torch::NoGradGuard no_grad;
  auto dict = make_pytorch_dict();
  for (const auto& p : state_->params) dict.insert(p.name, gather_full(state_->context.group, p));
  for (const auto& b : state_->root->named_buffers())
    dict.insert(b.key(),
                b.value().is_floating_point() ? b.value().to(torch::kFloat).cpu().clone() : b.value().cpu().clone());
  return dict;
}

void FullyShardedDataParallel::load_full_state_dict(const c10::IValue& state) {
  TORCH_CHECK(state.isGenericDict(),
              "ampp::dist::FullyShardedDataParallel::load_full_state_dict: expected a dict of "
              "tensors by name (a model's state_dict), got ",
              state.tagKind());
  const auto dict = state.toGenericDict();
  std::set<std::string> expected;
  std::ostringstream problems;
  auto take = [&](const std::string& name, at::IntArrayRef sizes) -> torch::Tensor {
    expected.insert(name);
    auto it = dict.find(name);
    if (it == dict.end() || !it->value().isTensor()) {
      problems << "\n  missing: " << name;
      return {};
    }
    auto t = it->value().toTensor();
    if (t.sizes() != sizes) problems << "\n  " << name << " has shape " << t.sizes() << ", the model " << sizes;
    return t.sizes() == sizes ? t : torch::Tensor();
  };
  torch::NoGradGuard no_grad;
  const int rank = state_->context.group.rank();
  for (auto& p : state_->params) {
    auto full = take(p.name, p.param.sizes());
    if (full.defined() && p.local_rows > 0)
      p.padded.narrow(0, 0, p.local_rows).copy_(full.reshape(p.sizes).narrow(0, rank * p.rows_per_rank, p.local_rows));
  }
  for (auto& b : state_->root->named_buffers()) {
    auto value = take(b.key(), b.value().sizes());
    if (value.defined()) b.value().copy_(value);
  }
  for (const auto& item : dict)
    if (!expected.count(item.key().toStringRef())) problems << "\n  unexpected: " << item.key().toStringRef();
  TORCH_CHECK(problems.str().empty(),
              "ampp::dist::FullyShardedDataParallel: the state dict does not fit the model:", problems.str());
  // Gathered units would hold the old values until they reshard: drop them now.
  reshard();
}

void FullyShardedDataParallel::save_full(const std::string& path) const {
  auto dict = full_state_dict();  // collective: every rank takes part
  if (state_->context.group.rank() == 0) save_pytorch(dict, path);
  state_->context.group.barrier();  // the file is whole before any rank goes on to read it
}

void FullyShardedDataParallel::load_full(const std::string& path) { load_full_state_dict(load_pytorch(path)); }

void FullyShardedDataParallel::save_sharded(const std::string& path, const torch::optim::Optimizer* optimizer) const {
  torch::serialize::OutputArchive archive;
  const auto& group = state_->context.group;
  archive.write("world_size", torch::tensor(static_cast<int64_t>(group.size())));
  archive.write("rank", torch::tensor(static_cast<int64_t>(group.rank())));
  for (const auto& p : state_->params) archive.write("shard." + p.name, p.padded);
  for (const auto& b : state_->root->named_buffers()) archive.write("buffer." + b.key(), b.value(), /*is_buffer=*/true);
  if (optimizer) {
    torch::serialize::OutputArchive state;
    optimizer->save(state);
    archive.write("optimizer", state);
  }
  save_archive_atomic(archive, path);
}

void FullyShardedDataParallel::load_sharded(const std::string& path, torch::optim::Optimizer* optimizer) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::Tensor world, rank;
  archive.read("world_size", world);
  archive.read("rank", rank);
  const auto& group = state_->context.group;
  TORCH_CHECK(world.item<int64_t>() == group.size() && rank.item<int64_t>() == group.rank(),
              "ampp::dist::FullyShardedDataParallel: ", path, " holds the shards of rank ", rank.item<int64_t>(),
              " of ", world.item<int64_t>(), ", and this is rank ", group.rank(), " of ", group.size(),
              ". Shards fit only their own rank and world size; to change them, save with save_full() (one "
              "unsharded file) and load that with load_full() on any number of ranks.");
  torch::NoGradGuard no_grad;
  for (auto& p : state_->params) {
    torch::Tensor padded;
    archive.read("shard." + p.name, padded);
    TORCH_CHECK(padded.sizes() == p.padded.sizes(), "ampp::dist::FullyShardedDataParallel: ", path, " holds ", p.name,
                " with shape ", padded.sizes(), ", the model's shard is ", p.padded.sizes());
    p.padded.copy_(padded);
  }
  for (auto& b : state_->root->named_buffers()) {
    torch::Tensor value;
    archive.read("buffer." + b.key(), value, /*is_buffer=*/true);
    b.value().copy_(value);
  }
  if (optimizer) {
    torch::serialize::InputArchive state;
    TORCH_CHECK(archive.try_read("optimizer", state), "ampp::dist::FullyShardedDataParallel: ", path,
                " holds no optimizer state (saved without one); load it without the optimizer");
    optimizer->load(state);
  }
  reshard();
}

}  // namespace ampp::dist
