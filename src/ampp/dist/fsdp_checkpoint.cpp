// FullyShardedDataParallel's checkpoints: the full state dict (every shard gathered; what torch.load and
// an unsharded model read) and one file per rank holding its shards (same world size and rank only).
#include <ampp/io/archive_reader.h>
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/util/archive_bytes.h>

#include <torch/serialize.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "control_tensors.h"
#include "fsdp_state.h"

namespace ampp::dist {
namespace {

// The whole tensor of a parameter's shape from every rank's rows of it (`rows`: this rank's, at most
// rows_per_rank of them; fewer are zero-padded, as the chunks are), on the CPU, in memory of its own.
torch::Tensor gather_full(const ProcessGroup& group, const detail::ShardedParam& p, const torch::Tensor& rows) {
  const int world = group.size();
  // A whole chunk (a parameter's own shard) is sent as it is; fewer rows are copied into a padded one.
  const bool whole = rows.size(0) == p.rows_per_rank && rows.is_contiguous() &&
                     rows.scalar_type() == p.padded.scalar_type() && rows.device() == p.padded.device();
  torch::Tensor chunk = whole ? rows.view({p.rows_per_rank, p.row_numel})
                              : torch::zeros({p.rows_per_rank, p.row_numel}, p.padded.options());
  if (!whole) chunk.narrow(0, 0, rows.size(0)).copy_(rows.reshape({rows.size(0), p.row_numel}));
  torch::Tensor all = chunk;
  if (world > 1) {
    all = torch::empty({world * p.rows_per_rank, p.row_numel}, p.padded.options());
    std::vector<std::vector<torch::Tensor>> out{all.chunk(world, 0)};
    std::vector<torch::Tensor> in{chunk};
    group.c10d()->allgather(out, in)->wait();
  }
  // A copy always: at world size 1 `all` may be the live shard, which a saved dict must not alias.
  return all.narrow(0, 0, p.rows).reshape(p.param.sizes()).to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace

StateDict FullyShardedDataParallel::full_state_dict() const {
  torch::NoGradGuard no_grad;
  auto dict = make_pytorch_dict();
  for (const auto& p : state_->params) dict.insert(p.name, gather_full(state_->context.group, p, p.padded));
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
  read_archive_file(archive, path, state_->shard_device());  // this rank's device, not the saving rank's
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

// ---- the optimizer's state ----

namespace {

using Dict = c10::impl::GenericDict;

Dict str_keyed_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

// PyTorch's names of the per-parameter state tensors shaped like their parameter (SGD's momentum, Adam's
// and AdamW's moments): the ones that are sharded. "step" is the same on every rank and stays as it is.
bool is_sharded_state(const std::string& key) {
  return key == "momentum_buffer" || key == "exp_avg" || key == "exp_avg_sq" || key == "max_exp_avg_sq";
}

// The sharded parameter behind each of the optimizer's parameters, in the order of the state dict's indices.
std::vector<const detail::ShardedParam*> params_by_index(const torch::optim::Optimizer& optimizer,
                                                         const std::vector<detail::ShardedParam>& params) {
  std::map<const c10::TensorImpl*, const detail::ShardedParam*> by_shard;
  for (const auto& p : params) by_shard[p.shard.unsafeGetTensorImpl()] = &p;
  std::vector<const detail::ShardedParam*> out;
  for (const auto& group : optimizer.param_groups())
    for (const auto& t : group.params()) {
      auto it = by_shard.find(t.unsafeGetTensorImpl());
      TORCH_CHECK(it != by_shard.end(),
                  "ampp::dist::FullyShardedDataParallel: the optimizer steps a tensor that is "
                  "not one of this FSDP's shards; build it over fsdp.parameters()");
      out.push_back(it->second);
    }
  return out;
}

// Copy of `state` (a parameter's state dict) with each sharded entry replaced by `convert(entry)`.
template <typename Convert>
Dict with_sharded_entries(const Dict& state, Convert convert) {
  Dict out = str_keyed_dict();
  for (const auto& item : state) {
    const std::string key = item.key().toStringRef();
    const bool sharded = is_sharded_state(key) && item.value().isTensor();
    out.insert(key, sharded ? c10::IValue(convert(key, item.value().toTensor())) : item.value());
  }
  return out;
}

// The optimizer state dict's "state" of each parameter, in index order (an empty dict where it has none).
std::vector<Dict> states_by_index(const Dict& state_dict, size_t n) {
  std::vector<Dict> out(n, str_keyed_dict());
  for (const auto& item : state_dict.at("state").toGenericDict()) {
    const int64_t index = item.key().toInt();
    TORCH_CHECK(index >= 0 && static_cast<size_t>(index) < n, "optimizer state for parameter ", index,
                ", which no group lists");
    TORCH_CHECK(item.value().isGenericDict(), "optimizer state of parameter ", index, " is not a dict");
    out[index] = item.value().toGenericDict();
  }
  return out;
}

// A state dict of `states` (by index) and the given param_groups.
Dict state_dict_of(const std::vector<Dict>& states, const c10::IValue& param_groups) {
  auto state = Dict(c10::IntType::get(), c10::AnyType::get());
  for (size_t i = 0; i < states.size(); ++i)
    if (!states[i].empty()) state.insert(static_cast<int64_t>(i), states[i]);
  Dict out = str_keyed_dict();
  out.insert("state", state);
  out.insert("param_groups", param_groups);
  return out;
}

}  // namespace

StateDict FullyShardedDataParallel::full_optimizer_state_dict(const torch::optim::Optimizer& optimizer) const {
  torch::NoGradGuard no_grad;
  const auto params = params_by_index(optimizer, state_->params);
  const Dict sharded = c10::impl::toGenericDict(optimizer_state_dict(optimizer).dict());
  auto states = states_by_index(sharded, params.size());
  // Every rank gathers the same entries in the same order: the ranks step the same parameters (each gets
  // a gradient, empty shards too), so they hold the same state keys. Checked, as a mismatch would hang.
  auto counts = torch::tensor({static_cast<int64_t>(0)});
  for (const auto& s : states) counts += static_cast<int64_t>(s.size());
  std::vector<torch::Tensor> io{counts.to(detail::control_device(state_->context.group, state_->shard_device()))};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  if (state_->context.group.size() > 1) state_->context.group.c10d()->allreduce(io, max)->wait();
  const auto agreed = io[0].cpu();
  TORCH_CHECK(agreed.item<int64_t>() == counts.item<int64_t>(),
              "ampp::dist::FullyShardedDataParallel::full_optimizer_state_dict: the ranks' optimizers hold "
              "different state (",
              counts.item<int64_t>(), " entries here, ", agreed.item<int64_t>(),
              " on another rank); every rank must step the same parameters");
  for (size_t i = 0; i < states.size(); ++i)
    states[i] = with_sharded_entries(states[i], [&](const std::string&, const torch::Tensor& rows) {
      return gather_full(state_->context.group, *params[i], rows);
    });
  return c10::impl::toTypedDict<std::string, c10::IValue>(state_dict_of(states, sharded.at("param_groups")));
}

void FullyShardedDataParallel::load_full_optimizer_state_dict(torch::optim::Optimizer& optimizer,
                                                              const c10::IValue& state) const {
  TORCH_CHECK(state.isGenericDict() && state.toGenericDict().contains("state") &&
                  state.toGenericDict().contains("param_groups"),
              "ampp::dist::FullyShardedDataParallel::load_full_optimizer_state_dict: expected an optimizer state "
              "dict (the keys \"state\" and \"param_groups\")");
  const auto params = params_by_index(optimizer, state_->params);
  auto states = states_by_index(state.toGenericDict(), params.size());
  const int rank = state_->context.group.rank();
  for (size_t i = 0; i < states.size(); ++i) {
    const auto& p = *params[i];
    states[i] = with_sharded_entries(states[i], [&](const std::string& key, const torch::Tensor& full) {
      TORCH_CHECK(full.sizes() == p.param.sizes(), "ampp::dist::FullyShardedDataParallel: the optimizer state \"", key,
                  "\" of ", p.name, " has shape ", full.sizes(), ", the parameter ", p.param.sizes());
      if (p.local_rows == 0) return torch::empty(p.shard.sizes(), full.options());  // a rank past the last row
      return full.reshape(p.sizes).narrow(0, rank * p.rows_per_rank, p.local_rows).clone();
    });
  }
  load_optimizer_state_dict(optimizer, state_dict_of(states, state.toGenericDict().at("param_groups")));
}

}  // namespace ampp::dist
