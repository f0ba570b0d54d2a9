// FullyShardedDataParallel: sharding a module's parameters into units, the registry unit_forward looks
// units up in, the root's forward and end-of-backward bookkeeping, and the sharded gradient clipping.
#include <ampp/dist/fully_shard.h>
#include <ampp/dist/hierarchical_allreduce.h>
#include <ampp/dist/reducer.h>
#include <ampp/util/batch_norm_like.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "control_tensors.h"
#include "fsdp_state.h"

namespace ampp::dist::detail {
namespace {

// unit_forward's lookup: module -> unit, for every live FullyShardedDataParallel.
std::mutex registry_mu;
std::unordered_map<const torch::nn::Module*, std::weak_ptr<FsdpUnit>>& registry() {
  static std::unordered_map<const torch::nn::Module*, std::weak_ptr<FsdpUnit>> units;
  return units;
}

bool is_norm(const torch::nn::Module& m) {
  namespace nn = torch::nn;
  return dynamic_cast<const nn::BatchNorm1dImpl*>(&m) || dynamic_cast<const nn::BatchNorm2dImpl*>(&m) ||
         dynamic_cast<const nn::BatchNorm3dImpl*>(&m) || dynamic_cast<const nn::LayerNormImpl*>(&m) ||
         dynamic_cast<const nn::GroupNormImpl*>(&m) || dynamic_cast<const nn::InstanceNorm1dImpl*>(&m) ||
         dynamic_cast<const nn::InstanceNorm2dImpl*>(&m) || dynamic_cast<const nn::InstanceNorm3dImpl*>(&m) ||
         dynamic_cast<const BatchNormLike*>(&m);
}

// The names of the parameters that normalisation layers own directly.
std::set<std::string> norm_parameter_names(const torch::nn::Module& root) {
  std::set<std::string> names;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    if (!is_norm(*item.value())) continue;
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) names.insert(prefix + p.key());
  }
  return names;
}

c10::ScalarType gathered_dtype_of(const std::string& name, const torch::Tensor& p, const MixedPrecisionPolicy& policy,
                                  const std::set<std::string>& norms) {
  if (!p.is_floating_point()) return p.scalar_type();
  if (auto it = policy.param_dtypes().find(name); it != policy.param_dtypes().end()) return it->second;
  if (policy.keep_norms_fp32() && norms.count(name)) return torch::kFloat;
  return policy.param_dtype().value_or(torch::kFloat);
}

}  // namespace

std::shared_ptr<FsdpUnit> fsdp_unit_of(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = registry().find(&module);
  return it == registry().end() ? nullptr : it->second.lock();
}

void fsdp_pre_forward(FsdpUnit& unit) {
  unit.scoped = true;
  unit.unshard();
  auto& order = *unit.context().order;
  order.entered.push_back(&unit);
  // The next unit's all-gather runs while this one computes.
  if (auto* next = order.neighbour(&unit, +1); next && unit.context().options.prefetch()) next->prefetch();
}

torch::Tensor fsdp_cast_input(FsdpUnit& unit, const torch::Tensor& input) {
  // As FSDP2: only a policy with a param_dtype casts; without one the inputs pass as they are.
  const auto& policy = unit.context().options.mp_policy();
  if (!policy.cast_forward_inputs() || !policy.param_dtype() || !input.is_floating_point()) return input;
  return input.to(*policy.param_dtype());
}

void fsdp_post_forward(const std::shared_ptr<FsdpUnit>& unit, const std::vector<torch::Tensor>& outputs) {
  bool needs_backward = false;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    needs_backward = true;
    std::weak_ptr<FsdpUnit> weak = unit;
    // Before the unit's backward: its parameters again, for the saved tensors that are views of them.
    out.register_hook([weak](const torch::Tensor& grad) {
      auto u = weak.lock();
      if (!u) return grad;
      u->unshard();
      // The unit whose backward comes next (entered before this one) gathers while this one's runs.
      auto* next = u->context().order->neighbour(u.get(), -1);
      if (next && u->context().options.prefetch()) next->prefetch();
      return grad;
    });
  }
  if (unit->context().options.reshard_after_forward() || !needs_backward) unit->reshard();
}

FsdpState::FsdpState(std::shared_ptr<torch::nn::Module> root_module, const FullyShardOptions& options)
    : root(std::move(root_module)) {
  context.group = options.process_group() ? *options.process_group() : default_group();
  context.options = options;
}

void FsdpState::shard_parameters(const std::vector<std::shared_ptr<torch::nn::Module>>& unit_modules) {
  const auto named = root->named_parameters();
  std::map<const c10::TensorImpl*, size_t> unit_of;  // parameter -> unit index (0: root)
  for (size_t u = 0; u < unit_modules.size(); ++u)
    for (const auto& p : unit_modules[u]->parameters()) {
      TORCH_CHECK(unit_of.emplace(p.unsafeGetTensorImpl(), u + 1).second,
                  "ampp::dist::FullyShardedDataParallel: units ", unit_of[p.unsafeGetTensorImpl()], " and ", u + 1,
                  " share a parameter; the units must be disjoint submodules (a parameter used by two of them, as "
                  "tied weights, belongs in their common parent: leave it out of the units)");
    }
  const auto norms = norm_parameter_names(*root);
  params.reserve(named.size());  // ShardedParam pointers stay valid
  std::vector<std::vector<ShardedParam*>> members(unit_modules.size() + 1);
  for (const auto& item : named) {
    params.push_back(make_sharded(item.key(), item.value(),
                                  gathered_dtype_of(item.key(), item.value(), context.options.mp_policy(), norms)));
    auto it = unit_of.find(item.value().unsafeGetTensorImpl());
    members[it == unit_of.end() ? 0 : it->second].push_back(&params.back());
  }
  for (size_t u = 1; u < members.size(); ++u)
    TORCH_CHECK(members[u].size() == unit_modules[u - 1]->parameters().size(),
                "ampp::dist::FullyShardedDataParallel: unit ", u, " is not a submodule of the root module (",
                unit_modules[u - 1]->parameters().size() - members[u].size(),
                " of its parameters are not the root's); pass submodules of the model being sharded");
  for (size_t u = 0; u < members.size(); ++u)
    units.push_back(std::make_shared<FsdpUnit>(std::move(members[u]), &context));
  for (auto& unit : units) unit->reshard();
  for (auto& unit : units) install_gradient_hooks(unit);
}

ShardedParam FsdpState::make_sharded(const std::string& name, const torch::Tensor& param, c10::ScalarType gathered) {
  torch::NoGradGuard no_grad;
  const int world = context.group.size(), rank = context.group.rank();
  ShardedParam p;
  p.name = name;
  p.sizes = param.dim() == 0 ? std::vector<int64_t>{1} : param.sizes().vec();
  p.rows = p.sizes[0];
  p.row_numel = p.rows == 0 ? 0 : param.numel() / p.rows;
  p.rows_per_rank = (p.rows + world - 1) / world;
  p.local_rows = p.rows_of_rank(rank);
  p.gathered = gathered;
  auto chunk_sizes = p.sizes;
  chunk_sizes[0] = p.rows_per_rank;
  p.padded = torch::zeros(chunk_sizes, param.options().dtype(torch::kFloat).requires_grad(false));
  if (p.local_rows > 0)
    p.padded.narrow(0, 0, p.local_rows).copy_(param.reshape(p.sizes).narrow(0, rank * p.rows_per_rank, p.local_rows));
  p.shard = p.padded.narrow(0, 0, p.local_rows).detach().requires_grad_(param.requires_grad());
  // The module's tensor keeps its identity (the module's members and autograd refer to it) and takes the
  // gathered dtype; its memory goes when the unit reshards.
  param.set_data(torch::empty(param.sizes(), param.options().dtype(gathered)));
  p.param = param;
  return p;
}

void FsdpState::install_gradient_hooks(const std::shared_ptr<FsdpUnit>& unit) {
  std::weak_ptr<FsdpUnit> weak = unit;
  for (auto* p : unit->params()) {
    if (!p->param.requires_grad()) continue;
    p->accumulator = torch::autograd::impl::grad_accumulator(p->param);
    p->accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [weak](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          if (auto u = weak.lock()) u->gradient_ready();
          return outputs;
        }));
  }
}

void FsdpState::register_units(const std::vector<std::shared_ptr<torch::nn::Module>>& unit_modules) {
  std::lock_guard<std::mutex> lock(registry_mu);
  for (size_t u = 0; u < unit_modules.size(); ++u) {
    registered.push_back(unit_modules[u].get());
    registry()[unit_modules[u].get()] = units[u + 1];
  }
}

FsdpState::~FsdpState() {
  std::lock_guard<std::mutex> lock(registry_mu);
  for (const auto* m : registered) registry().erase(m);
}

void FsdpState::use_shared_memory_if_local() {
  const auto& group = context.group;
  if (!context.options.shared_memory() || group.size() == 1) return;
  bool on_cpu = true;
  for (const auto& p : root->parameters()) on_cpu = on_cpu && p.device().is_cpu();
  // Every rank must take the same path: the machines are counted collectively, the devices agreed on.
  std::vector<torch::Tensor> io{
      torch::tensor({on_cpu ? 0 : 1}, torch::kInt).to(detail::control_device(group, root->parameters()))};
  group.c10d()->allreduce(io)->wait();
  if (io[0].item<int>() == 0 && group_by_machine(group).machines() == 1)
    context.shared_memory = std::make_shared<std::unique_ptr<SharedMemoryAllreduce>>();
}

void FsdpState::pre_root_forward() {
  // The first forward gathers every unit (a unit the model does not enter through unit_forward would
  // otherwise run on freed memory); later ones leave the units it entered to unit_forward.
  for (auto& unit : units)
    if (!forwarded || !unit->scoped) unit->unshard();
  forwarded = true;
  auto& order = *context.order;
  if (order.recorded.empty()) order.recorded = order.entered;  // the first forward's order, for prefetching
  order.entered.clear();
  // The first unit's all-gather runs while the root's own layers compute (the embeddings of a GPT).
  if (!order.recorded.empty() && context.options.prefetch()) order.recorded.front()->prefetch();
}

void FsdpState::end_backward() {
  callback_queued = false;
  // Units with parameters that got no gradient this time: reduced with zeros, in a fixed order, so every
  // rank issues the same collectives.
  for (auto it = units.rbegin(); it != units.rend(); ++it)
    if ((*it)->partly_ready()) (*it)->reduce_gradients();
  for (auto& unit : units) unit->reshard();
}

}  // namespace ampp::dist::detail

namespace ampp::dist {

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> root,
                                                   const std::vector<std::shared_ptr<torch::nn::Module>>& units,
                                                   FullyShardOptions options)
    : state_(std::make_shared<detail::FsdpState>(std::move(root), options)) {
  auto& s = *state_;
  TORCH_CHECK(s.root, "ampp::dist::FullyShardedDataParallel: the root module is null");
  // Every rank starts from rank 0's values, as DDP does (the shards are cut from them).
  auto tensors = s.root->parameters();
  for (const auto& b : s.root->buffers()) tensors.push_back(b);
  if (s.context.group.size() > 1) broadcast_coalesced(s.context.group, tensors, 25 << 20);
  s.use_shared_memory_if_local();
  s.shard_parameters(units);
  s.register_units(units);
  std::weak_ptr<detail::FsdpState> weak = state_;
  s.context.on_backward = [weak] {
    auto self = weak.lock();
    if (!self || self->callback_queued) return;
    self->callback_queued = true;
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto st = weak.lock()) st->end_backward();
    });
  };
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;
FullyShardedDataParallel::FullyShardedDataParallel(FullyShardedDataParallel&&) noexcept = default;
FullyShardedDataParallel& FullyShardedDataParallel::operator=(FullyShardedDataParallel&&) noexcept = default;

void FullyShardedDataParallel::pre_root_forward() { state_->pre_root_forward(); }

torch::Tensor FullyShardedDataParallel::cast_root_tensor(const torch::Tensor& input) {
  return detail::fsdp_cast_input(*state_->units[0], input);
}

torch::Tensor FullyShardedDataParallel::cast_root_output(const torch::Tensor& out) {
  const auto dtype = state_->context.options.mp_policy().output_dtype();
  return dtype && out.is_floating_point() ? out.to(*dtype) : out;
}

void FullyShardedDataParallel::post_root_forward_tensors(const std::vector<torch::Tensor>& outputs) {
  bool needs_backward = false;
  for (const auto& out : outputs) needs_backward = needs_backward || (out.defined() && out.requires_grad());
  if (!needs_backward) reshard();  // an evaluation forward: nothing stays gathered for a backward
}

std::vector<torch::Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : state_->params) out.push_back(p.shard);
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::named_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : state_->params) out.emplace_back(p.name, p.shard);
  return out;
}

torch::Tensor FullyShardedDataParallel::clip_grad_norm_(double max_norm) {
  torch::NoGradGuard no_grad;
  // The padding rows hold no gradient, so the shards' squares add up to the whole model's.
  // On the shards' device, which an NCCL group needs (and where the sum needs no host read).
  auto squares = torch::zeros({1}, torch::TensorOptions(torch::kDouble).device(state_->shard_device()));
  for (const auto& p : state_->params)
    if (p.shard.grad().defined()) squares += p.shard.grad().to(torch::kDouble).pow(2).sum();
  if (state_->context.group.size() > 1) {
    std::vector<torch::Tensor> io{squares};
    state_->context.group.c10d()->allreduce(io)->wait();
  }
  auto total = squares.sqrt().to(torch::kFloat);
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (total + 1e-6) when that is below 1.
  auto coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (const auto& p : state_->params)
    if (p.shard.grad().defined()) p.shard.mutable_grad().mul_(coef.to(p.shard.grad().device()));
  return total.squeeze();
}

std::function<void(torch::Tensor&)> FullyShardedDataParallel::found_inf_hook() const {
  ProcessGroup group = state_->context.group;
  return [group](torch::Tensor& found_inf) {
    if (group.size() == 1) return;
    std::vector<torch::Tensor> io{found_inf};
    group.c10d()->allreduce(io)->wait();  // a sum of 0/1 flags: non-zero where any rank found one
  };
}

void FullyShardedDataParallel::unshard() {
  for (auto& unit : state_->units) unit->unshard();
}

void FullyShardedDataParallel::reshard() {
  for (auto& unit : state_->units) unit->reshard();
}

int64_t FullyShardedDataParallel::prefetched_gathers() const { return state_->context.order->prefetched; }

std::shared_ptr<torch::nn::Module> FullyShardedDataParallel::root() const { return state_->root; }
const ProcessGroup& FullyShardedDataParallel::process_group() const { return state_->context.group; }

std::vector<std::vector<std::string>> FullyShardedDataParallel::unit_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& unit : state_->units) {
    out.emplace_back();
    for (const auto* p : unit->params()) out.back().push_back(p->name);
  }
  return out;
}

std::map<std::string, c10::ScalarType> FullyShardedDataParallel::gathered_dtypes() const {
  std::map<std::string, c10::ScalarType> out;
  for (const auto& p : state_->params) out[p.name] = p.gathered;
  return out;
}

}  // namespace ampp::dist
