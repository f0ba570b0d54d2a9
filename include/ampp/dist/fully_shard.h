#pragma once
// Fully sharded data parallel (PyTorch's FSDP2, torch.distributed.fsdp.fully_shard) for LibTorch
// modules, on any c10d backend (Gloo on CPU included):
//
//   ampp::dist::FullyShardedDataParallel fsdp(model, {block0, block1, ...},       // the sharding units
//       ampp::dist::FullyShardOptions().mp_policy(
//           ampp::dist::MixedPrecisionPolicy().param_dtype(torch::kBFloat16).keep_norms_fp32(true)));
//   torch::optim::AdamW opt(fsdp.parameters(), ...);    // the FP32 shards: 1/world of the model each
//   auto loss = criterion(fsdp.forward(x), y);
//   loss.backward();                                     // gradients reduce-scattered into the shards
//   opt.step();
//
// Each parameter is split along dim 0 into `world` chunks of ceil(dim0 / world) rows, zero-padded (the
// chunks of torch.chunk, as FSDP2); rank r keeps chunk r in FP32 as a leaf the optimizer steps. The
// module's own parameter tensors hold no memory between steps: a unit's are all-gathered (in
// param_dtype) before its forward and again before its backward, and freed after each. After a unit's
// backward its gradients are reduce-scattered (averaged) into the shards' .grad, and freed.
//
// The model's forward enters each unit through unit_forward (below), which is how a LibTorch module,
// which has no forward hooks, says "this unit starts and ends here". Units it never enters stay
// gathered from the root's forward to the end of backward (correct, with less memory saved), and the
// first forward gathers every unit, so a model that does not cooperate still trains correctly.
//
// Every rank must run the same forward and backward (the collectives match in order), and use the same
// parameters in each (as DDP without find_unused_parameters). Build the optimizer over parameters(), after
// this: the module's own parameters hold no memory and get no gradient. To use the module on its own again,
// call unshard() while this object lives (the module then keeps the gathered values).
#include <ampp/dist/ddp.h>
#include <ampp/dist/process_group.h>
#include <ampp/util/state_dict.h>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ampp::dist {

// Parameter name -> dtype.
using ParamDtypes = std::map<std::string, c10::ScalarType>;

// FSDP2's MixedPrecisionPolicy, plus per-parameter dtypes.
struct MixedPrecisionPolicy {
  // Dtype of the gathered (unsharded) parameters the forward and backward compute with; nullopt: FP32.
  TORCH_ARG(std::optional<c10::ScalarType>, param_dtype) = std::nullopt;
  // Dtype the gradients are reduce-scattered in; nullopt: each gradient's own (param_dtype).
  TORCH_ARG(std::optional<c10::ScalarType>, reduce_dtype) = std::nullopt;
  // Dtype the root's floating outputs are cast to; nullopt: as computed.
  TORCH_ARG(std::optional<c10::ScalarType>, output_dtype) = std::nullopt;
  // Cast floating tensor inputs of the root's and each unit's forward to param_dtype (when one is set).
  TORCH_ARG(bool, cast_forward_inputs) = true;
  // Beyond PyTorch: the gathered dtype of single parameters, by name as in named_parameters()
  // (e.g. {"h.0.ln_1.weight", kFloat}); overrides param_dtype.
  TORCH_ARG(ParamDtypes, param_dtypes) = {};
  // Beyond PyTorch: parameters of normalisation layers (BatchNorm, LayerNorm, GroupNorm, InstanceNorm,
  // and ampp's BatchNormLike) stay FP32 inside a low-precision unit, as apex's O2 keeps them.
  TORCH_ARG(bool, keep_norms_fp32) = false;
};

struct FullyShardOptions {
  // nullopt: the default group.
  TORCH_ARG(std::optional<ProcessGroup>, process_group) = std::nullopt;
  // Free a unit's gathered parameters after its forward and gather them again for its backward (ZeRO-3);
  // false keeps them from forward to backward (ZeRO-2: less communication, more memory).
  TORCH_ARG(bool, reshard_after_forward) = true;
  TORCH_ARG(MixedPrecisionPolicy, mp_policy) = {};
  // When every rank is on this machine and the parameters are on the CPU: the all-gathers and reduce-scatters
  // go through a shared-memory segment (SharedMemoryAllreduce) at memory bandwidth instead of the backend's
  // loopback TCP. Bit-identical to Gloo's for 2 ranks (sums in rank order). false: the backend always.
  TORCH_ARG(bool, shared_memory) = true;
  // FSDP2's implicit prefetching: while a unit computes, the all-gather of the unit the model enters next
  // (forward) or the one it entered before (backward) is under way, in the order of the first forward.
  // Through the backend's collectives only: the shared-memory transport copies on the computing thread.
  TORCH_ARG(bool, prefetch) = true;
};

namespace detail {
class FsdpState;
class FsdpUnit;
// The unit registered for `module` by a live FullyShardedDataParallel, or nullptr.
std::shared_ptr<FsdpUnit> fsdp_unit_of(const torch::nn::Module& module);
// The unit's pre-forward (gathers its parameters) and the cast of its floating inputs.
void fsdp_pre_forward(FsdpUnit& unit);
torch::Tensor fsdp_cast_input(FsdpUnit& unit, const torch::Tensor& input);
// The unit's post-forward: frees its parameters (reshard_after_forward) and gathers them again when the
// gradient of one of `outputs` arrives.
void fsdp_post_forward(const std::shared_ptr<FsdpUnit>& unit, const std::vector<torch::Tensor>& outputs);

template <typename T>
decltype(auto) fsdp_cast_arg(FsdpUnit& unit, T&& arg) {
  if constexpr (std::is_same_v<std::decay_t<T>, torch::Tensor>)
    return fsdp_cast_input(unit, arg);
  else
    return std::forward<T>(arg);
}
}  // namespace detail

// Runs module->forward(args...) as an FSDP unit: its parameters are gathered for it and freed after it
// (when `module` is a unit of a live FullyShardedDataParallel; otherwise it is a plain call).
//   for (auto& block : blocks) x = ampp::dist::unit_forward(block, x);
template <typename ModulePointer, typename... Args>
auto unit_forward(ModulePointer& module, Args&&... args) {
  auto unit = detail::fsdp_unit_of(*module);
  if (!unit) return module->forward(std::forward<Args>(args)...);
  detail::fsdp_pre_forward(*unit);
  auto out = module->forward(detail::fsdp_cast_arg(*unit, std::forward<Args>(args))...);
  std::vector<torch::Tensor> outputs;
  detail::collect_tensors(out, outputs);
  detail::fsdp_post_forward(unit, outputs);
  return out;
}

class FullyShardedDataParallel {
 public:
  // Shards `root`: the parameters of each of `units` (submodules of root, disjoint) form a unit, the rest
  // of root's parameters the root unit. Rank 0's parameters and buffers are broadcast first, as DDP does.
  FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> root,
                           const std::vector<std::shared_ptr<torch::nn::Module>>& units,
                           FullyShardOptions options = {});
  template <typename Holder>
  FullyShardedDataParallel(const torch::nn::ModuleHolder<Holder>& root,
                           const std::vector<std::shared_ptr<torch::nn::Module>>& units, FullyShardOptions options = {})
      : FullyShardedDataParallel(root.ptr(), units, std::move(options)) {}
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(FullyShardedDataParallel&&) noexcept;
  FullyShardedDataParallel& operator=(FullyShardedDataParallel&&) noexcept;

  // The root's forward with FSDP's bookkeeping (the root unit gathered; outputs cast to output_dtype).
  // `ModuleType` is root's concrete type (or a base of it): fsdp.forward<GptImpl>(tokens).
  template <typename ModuleType, typename... Args>
  auto forward(Args&&... args) {
    // A checked cast: some LibTorch modules (1.13's Sequential) derive from Module virtually.
    auto* typed = dynamic_cast<ModuleType*>(root().get());
    TORCH_CHECK(typed, "ampp::dist::FullyShardedDataParallel::forward<ModuleType>: the root module is not a ",
                c10::demangle_type<ModuleType>(), "; name the root's own type");
    pre_root_forward();
    auto& module = *typed;
    auto out = module.forward(cast_root_input(std::forward<Args>(args))...);
    return post_root_forward(out);
  }

  // The FP32 shards, in named_parameters() order: what the optimizer steps (each rank its own rows).
  std::vector<torch::Tensor> parameters() const;
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  // torch.nn.utils.clip_grad_norm_ over the whole model (one allreduce of the shards' squared norms);
  // returns the total norm before clipping, the same on every rank.
  torch::Tensor clip_grad_norm_(double max_norm);
  // Collective: the full model as module_state_dict() would give it unsharded (FP32, by name; buffers
  // too), on every rank.
  StateDict full_state_dict() const;
  // Every rank: takes its shards from a full state dict (full_state_dict(), or any world size's).
  void load_full_state_dict(const c10::IValue& state);
  // Collective: rank 0 writes full_state_dict() atomically as a PyTorch file (torch.load reads it).
  void save_full(const std::string& path) const;
  void load_full(const std::string& path);
  // Collective: the state of `optimizer` (SGD, Adam or AdamW, built over parameters()) as PyTorch's
  // optimizer.state_dict() of the unsharded model, on every rank: each parameter's momentum or moments
  // gathered whole ("step" as it is). FSDP2's get_optimizer_state_dict with full_state_dict=True; what the
  // same optimizer over the unsharded module loads with load_optimizer_state_dict, and torch.load reads.
  StateDict full_optimizer_state_dict(const torch::optim::Optimizer& optimizer) const;
  // Every rank: `optimizer` (over parameters()) takes its rows of a full optimizer state dict, from
  // full_optimizer_state_dict() of any world size or from the unsharded model's optimizer.
  void load_full_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state) const;
  // This rank's shards alone (and the state of `optimizer`, which steps them, when given), atomically;
  // load_sharded() refuses another world size or rank, saying how to move between them (through save_full).
  void save_sharded(const std::string& path, const torch::optim::Optimizer* optimizer = nullptr) const;
  void load_sharded(const std::string& path, torch::optim::Optimizer* optimizer = nullptr);
  // For GradScaler::set_found_inf_hook: an inf in one rank's shard makes every rank skip the step (each
  // rank unscales only its shards, so the ranks must agree; one allreduce).
  std::function<void(torch::Tensor& found_inf)> found_inf_hook() const;
  // Gathers every unit into the module's parameters (in their gathered dtypes), e.g. to read or save the
  // model as a whole; they stay until reshard() or the units' next forward.
  void unshard();
  // Frees every gathered parameter (e.g. after an evaluation forward without backward).
  void reshard();

  std::shared_ptr<torch::nn::Module> root() const;
  const ProcessGroup& process_group() const;
  // The units as built: 0 is the root unit, then `units` in order. Each entry: its parameters' names.
  std::vector<std::vector<std::string>> unit_parameter_names() const;
  // The gathered dtype of each parameter (the policy applied), by name.
  std::map<std::string, c10::ScalarType> gathered_dtypes() const;
  // How many units' all-gathers so far were issued ahead of their use (FullyShardOptions::prefetch).
  int64_t prefetched_gathers() const;

 private:
  void pre_root_forward();
  template <typename T>
  decltype(auto) cast_root_input(T&& arg) {
    if constexpr (std::is_same_v<std::decay_t<T>, torch::Tensor>)
      return cast_root_tensor(arg);
    else
      return std::forward<T>(arg);
  }
  torch::Tensor cast_root_tensor(const torch::Tensor& input);
  template <typename T>
  T post_root_forward(T out) {
    std::vector<torch::Tensor> outputs;
    detail::collect_tensors(out, outputs);
    if constexpr (std::is_same_v<T, torch::Tensor>) {
      out = cast_root_output(out);
      post_root_forward_tensors({out});
    } else {
      post_root_forward_tensors(outputs);
    }
    return out;
  }
  torch::Tensor cast_root_output(const torch::Tensor& out);
  void post_root_forward_tensors(const std::vector<torch::Tensor>& outputs);

  std::shared_ptr<detail::FsdpState> state_;
};

}  // namespace ampp::dist
