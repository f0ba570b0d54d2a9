#include "checkpoints.h"
#include "divergence.h"
#include "set_lr.h"

namespace ampp::train::detail {

namespace {

// ZeRO under O2: each rank holds the FP32 masters of its shard only. One allreduce gives every rank all of
// them: the owner adds its master to -0.0, the others -0.0, which leaves every value exact (signed zeros too).
std::vector<torch::Tensor> gather_masters(Run& run) {
  auto* zero = run.zero();
  if (!zero || !run.amp.properties().master_weights().value_or(false)) return {};
  const auto mine = run.amp.master_params();  // in param-group order, as owners()
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < mine.size(); ++i) {
    const bool owned = zero->owners().at(i) == run.workers.rank;
    parts.push_back(owned ? mine[i].detach().to(torch::kFloat).flatten()
                          : torch::full({mine[i].numel()}, -0.0, torch::kFloat));
  }
  auto flat = torch::cat(parts);
  allreduce_sum(run.workers.pg, flat);
  std::vector<torch::Tensor> all;
  int64_t offset = 0;
  for (const auto& m : mine) {
    all.push_back(flat.slice(0, offset, offset + m.numel()).view(m.sizes()));
    offset += m.numel();
  }
  return all;
}

// FSDP, while a checkpoint is written: the whole model back in the module and the run's optimizer over it
// holding every shard's state (SGD's momentum, AdamW's moments), so that the file is the unsharded run's (DDP and any
// world size resume it). Collective.
class GatheredForCheckpoint {
 public:
  explicit GatheredForCheckpoint(Run& run) : run_(run) {
    if (!run_.fsdp) return;
    run_.fsdp->unshard();
    run_.fsdp_optimizer = plain_optimizer(param_groups_for(run_.model->parameters(), run_.o), run_.o, false);
    load_optimizer_state_dict(*run_.fsdp_optimizer, run_.fsdp->full_optimizer_state_dict(run_.optimizer));
  }
  ~GatheredForCheckpoint() {
    if (!run_.fsdp) return;
    run_.fsdp_optimizer.reset();
    run_.fsdp->reshard();
  }
  GatheredForCheckpoint(const GatheredForCheckpoint&) = delete;
  GatheredForCheckpoint& operator=(const GatheredForCheckpoint&) = delete;

 private:
  Run& run_;
};

}  // namespace

// Running sums become global totals held by rank 0, so any world size resumes them exactly.
void save(Run& run, int64_t epoch, int64_t batch) {
  set_lr(run.optimizer, run.lr->last_lr());   // a fused optimizer's groups hold no lr of their own: the last step's
  const GatheredForCheckpoint gathered(run);  // before the check, which reads the whole weights
  if (!check_finite_weights(run)) return;     // a diagnosis run goes on; the last checkpoint stays
  const EpochSums totals = global_totals(run.workers.pg, run.sums);
  run.sums = run.workers.leader() ? totals : EpochSums{};
  if (auto* zero = run.zero()) zero->consolidate_state_dict(0);  // every rank sends its shard to the leader
  run.gathered_masters = gather_masters(run);
  if (!run.workers.leader()) return;
  RunPosition now;
  now.fingerprint = fingerprint(run.o, run.workers.world, run.cosine_steps);
  now.epoch = epoch;
  now.batch = batch;
  now.global_step = run.position.global_step;
  now.skipped_total = run.position.skipped_total;
  now.elapsed = run.elapsed();
  now.epoch_sums = run.sums;
  now.last_train_loss = run.report.last_train_loss;
  ++run.saves;
  if (run.faults.before_save)  // tests only (fault_injection.h)
    run.faults.before_save(run.saves, now.global_step, temporary_path_for(run.checkpoint),
                           [&] { return training_checkpoint_bytes(run.objects_to_save(), now); });
  save_training_checkpoint(run.checkpoint, run.objects_to_save(), now);
  save_pytorch_training_checkpoint(pytorch_checkpoint_path(run.o), run.objects_to_save(), now);
  dist::report_progress(run.position.global_step);
}

// Whether the step just taken ends with a checkpoint before its epoch's end (which end_epoch() writes):
// every checkpoint_every steps, and where the step limit stops the run.
bool saves_mid_epoch(const Run& run, bool epoch_end, bool stop) {
  const int64_t every = run.o.checkpoint_every();
  const bool periodic = every > 0 && run.position.global_step % every == 0;
  return !run.checkpoint.empty() && !epoch_end && (stop || periodic);
}

}  // namespace ampp::train::detail
