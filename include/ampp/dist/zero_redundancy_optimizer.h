#pragma once
// ZeRO stage 1 (PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer): each rank keeps the
// optimizer state of a shard of the parameters only, steps that shard, and broadcasts the updated
// parameters to the other ranks. With Adam this divides the optimizer-state memory by the world size.
//
//   auto ddp = ampp::dist::DistributedDataParallel(model);             // gradients averaged as usual
//   auto zero = ampp::dist::ZeroRedundancyOptimizer::of<torch::optim::Adam>(
//       model->parameters(), torch::optim::AdamOptions(1e-3));
//   ...  loss.backward(); zero.step();                                 // or scaler.step(zero)
//
// It is a torch::optim::Optimizer: param_groups() lists every parameter (so GradScaler::unscale_,
// gradient clipping, zero_grad and learning-rate changes work as with the wrapped optimizer; option
// changes reach the local optimizer at the next step(), as in PyTorch). Every rank must call step().
// It takes the GradScaler's scale, skip flag and a tensor lr as a fused optimizer does
// (GradScaleAwareOptimizer) and hands them to the local optimizer: with a fused one (FusedSGD, FusedAdamW)
// a scaled, skipped or scheduled step reads nothing on the host; with a plain one ZeRO unscales the shard's
// gradients itself and reads the skip flag and the lr on the host (docs/architecture.md, the training step).
// Checkpoints: save_consolidated() writes the state of all shards as the *unsharded* optimizer's
// archive (loadable by a plain optimizer of the same type, or by a ZeroRedundancyOptimizer of any
// world size); save_shard() writes this rank's shard alone (same world size only).
#include <ampp/dist/join.h>
#include <ampp/dist/process_group.h>
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/util/sharded_optimizer.h>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ampp::dist {

struct ZeroRedundancyOptimizerOptions {
  // The group whose ranks share the optimizer state; nullopt: the default group.
  TORCH_ARG(std::optional<ProcessGroup>, process_group) = std::nullopt;
  // The updated parameters travel in broadcasts of at most this many MiB (parameters packed together;
  // a larger parameter is broadcast on its own, uncopied). Bounds the transient memory of a step.
  TORCH_ARG(double, broadcast_bucket_mb) = 25.0;
};

// Builds the wrapped optimizer over the given groups (this rank's shard, or all parameters when
// consolidating a checkpoint). The groups carry their options; the optimizer's defaults do not matter.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<torch::optim::OptimizerParamGroup>&)>;

// PyTorch's partition: within each param group, parameters by size (largest first, ties in order),
// each to the rank that holds the fewest elements so far (the lowest such rank), counts carried over
// from group to group. Returns the owning rank of every parameter, in param-group order.
std::vector<int> assign_parameters_to_ranks(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                            int world_size);

class ZeroRedundancyOptimizer : public torch::optim::Optimizer,
                                public ShardedOptimizer,
                                public Joinable,
                                public GradScaleAwareOptimizer {
 public:
  ZeroRedundancyOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& groups, OptimizerFactory factory,
                          ZeroRedundancyOptimizerOptions options = {});

  // ZeroRedundancyOptimizer::of<torch::optim::Adam>(params, AdamOptions(1e-3)).
  template <typename OptimizerType, typename OptionsType>
  static ZeroRedundancyOptimizer of(std::vector<torch::Tensor> params, const OptionsType& defaults,
                                    ZeroRedundancyOptimizerOptions options = {}) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::move(params), std::make_unique<OptionsType>(defaults));
    return ZeroRedundancyOptimizer(groups, factory_of<OptimizerType, OptionsType>(defaults), std::move(options));
  }
  template <typename OptimizerType, typename OptionsType>
  static OptimizerFactory factory_of(const OptionsType& defaults) {
    return [defaults](const std::vector<torch::optim::OptimizerParamGroup>& groups) {
      return std::make_unique<OptimizerType>(groups, defaults);
    };
  }

  // Steps this rank's shard with the wrapped optimizer, then broadcasts every shard from its owner.
  // A closure is rejected (it would run once per rank on different shards).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // ShardedOptimizer: under ampp::initialize's O2 this rank keeps FP32 masters for its shard only;
  // the low-precision model parameters are what the ranks broadcast.
  bool steps_locally(const torch::Tensor& param) const override;
  void use_master(const torch::Tensor& param, const torch::Tensor& master) override;
  void set_after_local_step(std::function<void()> copy_masters_to_model) override;

  // Joinable (join.h), after DDP: join({&ddp.joinable(), &zero}, loop). A rank that ran out of inputs
  // answers each of the others' steps with its shard as it is (as PyTorch's join hook): the shard of a
  // joined rank is no longer updated. Every active iteration must call step() once.
  void set_join_mode(const JoinOptions* options) override;
  int shadow_iteration() override;
  void finish_join(bool active_to_the_end) override;

  // This rank's shard (in param-group order; its FP32 masters under O2) and its optimizer.
  std::vector<torch::Tensor> local_parameters() const;
  torch::optim::Optimizer& local_optimizer() { return *local_; }
  // The owner of each parameter of param_groups(), in order.
  const std::vector<int>& owners() const { return owners_; }
  int rank() const { return group_.rank(); }
  int world_size() const { return group_.size(); }
  // The step's broadcasts of the updated parameters through `group` instead (the same ranks, in the same
  // order), e.g. NCCL's for CUDA parameters while the checkpoints' gathers of bytes stay on the Gloo group.
  // Collective order is unchanged, so every rank must make the same call before its next step.
  void set_broadcast_group(const ProcessGroup& group);

  // Collective (every rank): gathers every shard's state on rank `to`, where save() then writes it as
  // the unsharded optimizer's archive. PyTorch's consolidate_state_dict(to).
  void consolidate_state_dict(int to = 0);
  // After consolidate_state_dict(), on that rank: the archive of the unsharded optimizer.
  void save(torch::serialize::OutputArchive& archive) const override;
  // After consolidate_state_dict(), on that rank: the unsharded optimizer holding every shard's state
  // (over the same parameter tensors), e.g. to convert it; nullptr elsewhere.
  torch::optim::Optimizer* consolidated() { return consolidated_.get(); }
  // Every rank: takes its shard's state and the groups' options from an unsharded optimizer over the same
  // parameter tensors (e.g. one a PyTorch checkpoint was loaded into).
  void load_from(torch::optim::Optimizer& unsharded);
  // Every rank: reads an unsharded optimizer's archive (from save() of any world size, or of the plain
  // wrapped optimizer) and keeps its own shard's state and the groups' options.
  void load(torch::serialize::InputArchive& archive) override;

  // Collective: consolidate on `to`, which writes `path` atomically (never half a file).
  void save_consolidated(const std::string& path, int to = 0);
  // This rank's shard alone, atomically; load_shard() accepts it only with the same world size,
  // rank and partition (it says which differs).
  void save_shard(const std::string& path) const;
  void load_shard(const std::string& path);

 private:
  std::vector<torch::optim::OptimizerParamGroup> groups_of_rank(int rank) const;
  torch::Tensor owners_tensor() const;  // for a shard's file
  void sync_options_to_local();
  void step_local();
  void step_plain_local();
  void broadcast_parameters();

  ProcessGroup group_;
  std::optional<ProcessGroup> broadcast_group_;  // set_broadcast_group(); else group_
  OptimizerFactory factory_;
  ZeroRedundancyOptimizerOptions options_;
  std::vector<int> owners_;
  // What each rank broadcasts after its step: the parameters it owns, as the model holds them.
  std::vector<std::vector<torch::Tensor>> shared_by_owner_;
  std::function<void()> after_local_step_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  // The unsharded optimizer holding every shard's state, on the consolidating rank until saved.
  std::unique_ptr<torch::optim::Optimizer> consolidated_;
};

}  // namespace ampp::dist
