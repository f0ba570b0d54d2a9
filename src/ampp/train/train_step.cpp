#include "train_step.h"

#include <c10/util/ScopeExit.h>

#include "clip_grad_norm.h"

namespace ampp::train::detail {

namespace {

// Module paths of the parameters whose gradients hold inf/NaN. Only after a skipped step (one pass
// over the gradients): the model's own gradients at every opt level (O2's masters are copies), or under
// FSDP this rank's shards of them.
std::vector<std::string> non_finite_gradient_names(const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  std::vector<std::string> keys;
  std::vector<torch::Tensor> grads;
  for (const auto& [name, p] : named) {
    if (!p.grad().defined()) continue;
    keys.push_back(name);
    grads.push_back(p.grad());
  }
  if (grads.empty()) return {};
  std::vector<std::string> names;
  for (size_t i = 0; i < grads.size(); ++i)
    if (numerics::has_non_finite({grads[i]})) names.push_back(keys[i]);
  return names;
}

// The gradients the optimizer steps (O2: the masters'), by the model's parameter names.
std::vector<std::pair<std::string, torch::Tensor>> named_master_gradients(const Run& run) {
  auto named = named_master_params(*run.model, run.amp);
  for (auto& [name, master] : named) master = master.grad();
  return named;
}

// A test's inf in the loss (FaultInjection::inf_steps): the loss times a factor on the device, 1 or +inf,
// which set_inf_injection() fills before each step. A CUDA graph captures the product and reads the factor
// at each replay, so a replayed step can be the one that overflows (issue 52, defect 10).
torch::Tensor maybe_inject_inf(const Run& run, const torch::Tensor& loss) {
  return run.inf_factor.defined() ? loss * run.inf_factor : loss;
}

// The doctor, at the first skipped step: rank 0 runs its batch's forward and scaled backward again
// under a NonFiniteLocator to find the op (and module) where the first inf/NaN was born. The step was
// skipped, so the weights are the ones it saw; the model is called directly (not through DDP: no
// collective; under no_sync(), which tells DDP the gradients stay local), BatchNorm's statistics are put
// back and the gradients dropped. SyncBatchNorm uses rank 0's own batch statistics here: the other ranks
// do not take part.
void locate_first_non_finite(Run& run, const Batch& batch, double scale) {
  run.buffer_guard.save();
  std::optional<NonFiniteOrigin> origin;
  {
    dist::LocalBatchNormGuard no_collectives;
    std::optional<dist::NoSyncGuard> local;
    if (run.ddp) local.emplace(run.ddp->no_sync());
    NonFiniteLocator locate(*run.model);
    auto logits = run.amp.forward(run.model, batch.data).to(torch::kFloat32);
    (classification_loss(logits, batch.target) * scale).backward();
    origin = locate.first();
  }
  run.buffer_guard.restore();
  run.amp.zero_grad();
  run.report.first_non_finite = {{"step", run.position.global_step + 1}, {"rank", run.workers.rank}};
  run.report.first_non_finite["origin"] = origin ? nlohmann::json(origin->describe()) : nlohmann::json(nullptr);
  run.report.first_non_finite["module"] = origin ? origin->module : "";
  if (!origin)
    run.report.first_non_finite["note"] =
        "rank 0's batch replayed finite: the inf/NaN came from another rank's batch or was injected";
}

// Without a loss scaler nothing has checked the gradients, and one inf/NaN would reach every weight: the
// step is skipped as the scaler would skip it, on this flag (float32, 0-dim, non-zero: inf/NaN), made on
// the device. Under FSDP each rank holds only its shards, so the ranks agree (one allreduce, through the
// host); with DDP the gradients are already averaged, so every rank decides alike.
torch::Tensor unscaled_gradients_non_finite(Run& run) {
  const auto grads = gradients_of(run.amp.master_params());
  auto found = torch::zeros({}, torch::dtype(torch::kFloat).device(grads.empty() ? run.device : grads[0].device()));
  if (!grads.empty()) numerics::non_finite_check_and_unscale_(grads, found, torch::ones({}, found.options()));
  if (!run.fsdp) return found;
  auto everywhere = found.to(torch::kCPU, torch::kDouble);
  allreduce_sum(run.workers.pg, everywhere);
  return everywhere.to(found.device(), torch::kFloat);
}

// The tensors whose gradients the step reads, by parameter name: the model's, or this rank's FSDP shards.
std::vector<std::pair<std::string, torch::Tensor>> named_gradient_holders(const Run& run) {
  if (run.fsdp) return run.fsdp->named_parameters();
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : run.model->named_parameters()) named.emplace_back(p.key(), p.value());
  return named;
}

void clip_gradients(Run& run) {
  if (*run.o.clip_grad_norm() <= 0) return;
  if (run.fsdp)
    run.fsdp->clip_grad_norm_(*run.o.clip_grad_norm());  // the global norm over every rank's shards
  else
    clip_grad_norm_on_device(run.amp.master_params(), *run.o.clip_grad_norm());
}

// The optimizer's step, skipped where the gradients are not finite, decided once and recorded in Amp's skip
// ledger (Note [the skip ledger], skip_ledger.h): by Amp's loss scaler where the run scales its loss, else
// by `non_finite` (above). Returns the ledger's flag (float32, 0-dim, on the device, non-zero: skipped); the
// trainer's tally, the lr's position (StepLr) and the checkpoints read the ledger and count nothing
// themselves. A fused optimizer skips by itself on the device; another needs the flag on the host: see
// Note [what the host reads] (run.h).
torch::Tensor step_optimizer(Run& run, const torch::Tensor& non_finite) {
  if (non_finite.defined())
    run.amp.step_unless(non_finite);
  else
    run.amp.step();
  return run.amp.ledger().skipped_flag();
}

// The last backward's wait for its buckets' allreduce, after autograd finished (reducer.h).
double allreduce_wait_seconds(Ddp& ddp) {
  const dist::IterationTimeline t = ddp.reducer().last_timeline();
  return std::chrono::duration<double>(t.finalize_end - t.finalize_begin).count();
}

// Where a step's inf/NaN gradients are, read before the step (which drops a skipped step's gradients, as
// apex), on a trainer that reads every step: host reads, free on the CPU (Note [what the host reads], run.h).
std::vector<std::string> overflowed_before_step(Run& run, const torch::Tensor& non_finite) {
  if (!run.reads_every_step) return {};
  const bool skips = non_finite.defined() ? non_finite.item<float>() != 0.0F : run.amp.step_will_skip();
  return skips ? non_finite_gradient_names(named_gradient_holders(run)) : std::vector<std::string>{};
}

torch::Tensor forward_logits(Run& run, const torch::Tensor& data) {
  ShardedForward sharded{run.fsdp.get()};
  const torch::Tensor logits = run.ddp    ? run.amp.forward(*run.ddp, data)
                               : run.fsdp ? run.amp.forward(sharded, data)
                                          : run.amp.forward(run.model, data);
  return logits.to(torch::kFloat32);
}

// TransformerEngine's reduce_amax for the delayed fp8 recipe: the step's amaxes (row 0 of each layer's
// history) become their max over the ranks, so every rank folds the same history into the same scales. One
// allreduce per step, over DDP's NCCL group on GPUs that have one each (queued on NCCL's stream, no host
// wait); over the run's Gloo group otherwise (on the CPU; GPUs that share a device stage through the host).
void reduce_float8_amaxes(Run& run) {
  if (run.workers.world == 1 || run.o.fp8() != Float8Recipe::kDelayed) return;
  std::vector<torch::Tensor> rows;
  for (const auto& module : run.model->modules()) {
    const auto* layer = module->as<Float8LinearImpl>();
    if (layer && layer->delayed_state().amax_history.defined()) rows.push_back(layer->delayed_state().amax_history[0]);
  }
  if (rows.empty()) return;
  std::vector<torch::Tensor> flat{torch::cat(rows)};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  const dist::ProcessGroup& group = run.device_group ? *run.device_group : run.workers.pg;
  group.c10d()->allreduce(flat, max)->wait();
  for (size_t i = 0; i < rows.size(); ++i) rows[i].copy_(flat[0].narrow(0, 3 * static_cast<int64_t>(i), 3));
}

// A step's forward and backward: its whole batch, or TrainOptions::grad_accum equal micro-batches, each
// loss divided by their number. All but the last backward leave the gradients scaled (apex's
// delay_unscale) and, under DDP, on this rank (no_sync). The whole batch's logits and mean loss, and the
// last scaled loss, whose scale is the step's.
struct ForwardBackward {
  torch::Tensor logits, loss;
  std::optional<ScaledLoss> scaled;
};

ForwardBackward forward_backward(Run& run, const torch::Tensor& data, const torch::Tensor& target) {
  const int64_t n = run.o.grad_accum();
  const auto micro_data = data.chunk(n), micro_target = target.chunk(n);
  std::vector<torch::Tensor> logits, losses;
  ForwardBackward out;
  for (int64_t i = 0; i < n; ++i) {
    const bool last = i + 1 == n;
    std::optional<dist::NoSyncGuard> local;
    if (run.ddp && !last) local.emplace(run.ddp->no_sync());
    logits.push_back(forward_logits(run, micro_data[i]));
    const auto loss = classification_loss(logits.back(), micro_target[i]);
    losses.push_back(loss.detach());
    out.scaled.emplace(run.amp.scale_loss(maybe_inject_inf(run, n == 1 ? loss : loss / static_cast<double>(n)),
                                          ScaleLossOptions().delay_unscale(!last)));
    run.report.clock.lap(StepPhase::kForward);
    out.scaled->backward();
    run.report.clock.lap(StepPhase::kBackward);
  }
  reduce_float8_amaxes(run);
  // One batch (the default) takes no division, copy or mean: the step's kernels as without accumulation.
  out.logits = n == 1 ? logits[0].detach() : torch::cat(logits).detach();
  out.loss = n == 1 ? losses[0] : torch::stack(losses).mean();  // equal micro-batches: the batch's mean
  return out;
}

// One training step, queued with nothing read on the host (a CUDA graph captures it), but for what a
// trainer that reads every step asks (overflowed_before_step) and the doctor's inspection.
detail::StepTally::Step train_step(Run& run, const torch::Tensor& data, const torch::Tensor& target) {
  Amp& amp = run.amp;
  amp.zero_grad();  // same result as opt.zero_grad(), without the memset and add (amp/amp.h)
  if (run.report.fp8_ranges) run.report.fp8_ranges->set_step(run.position.global_step + 1);
  run.buffer_guard.save();
  auto [logits, loss, scaled] = forward_backward(run, data, target);
  if (run.ddp) run.report.clock.move(StepPhase::kBackward, StepPhase::kAllreduceWait, allreduce_wait_seconds(*run.ddp));
  if (run.report.ranges) run.report.ranges->observe(named_master_gradients(run), scaled->scale(), loss.item<double>());
  const torch::Tensor non_finite = amp.checks_overflow() ? torch::Tensor() : unscaled_gradients_non_finite(run);
  run.report.step_overflowed = overflowed_before_step(run, non_finite);
  clip_gradients(run);  // a skipped step's clipped gradients are never used
  run.lr->apply(run.optimizer, run.amp.ledger().taken_on(run.device));
  const torch::Tensor skipped = step_optimizer(run, non_finite);
  run.buffer_guard.restore_where_non_finite();  // also after a taken step: x*x can overflow while x did not
  if (run.report.ranges && run.report.first_non_finite.is_null() && skipped.defined() && skipped.item<float>() != 0.0F)
    locate_first_non_finite(run, Batch{data, target}, scaled->scale());
  run.report.clock.lap(StepPhase::kOptimizer);
  return {logits, loss, skipped};
}

// The factor maybe_inject_inf() multiplies the loss by at the next step: a fill, queued, read by no host.
void set_inf_injection(Run& run) {
  if (run.faults.inf_steps.empty()) return;
  const int64_t step = run.position.global_step + 1;
  const bool inject = run.faults.inf_steps.count(step) > 0;
  if (!run.inf_factor.defined()) run.inf_factor = torch::ones({}, torch::TensorOptions().device(run.device));
  run.inf_factor.fill_(inject ? std::numeric_limits<float>::infinity() : 1.0F);
  if (inject)
    std::fprintf(stderr, "ampp train: test fault: rank %d: inf loss injected at step %lld\n", run.workers.rank,
                 static_cast<long long>(step));
}

}  // namespace

// The step, eager or replayed from a CUDA graph (TrainOptions::cuda_graphs), added to the run's tally. Its lr
// is looked up at the steps taken on the device (Note [the step's lr], step_lr.h), so one capture serves the
// whole schedule, warmup and skips included.
void run_step(Run& run, const Batch& batch) {
  set_inf_injection(run);
  std::optional<ErrorOnCudaSync> no_sync;  // a GPU test's proof that the step reads nothing on the host
  if (run.faults.error_on_sync) no_sync.emplace();
  if (run.graphed) {
    run.report.clock.pause(true);  // the captured laps would be events inside the graph: the replay is one interval
    const auto resume_clock = c10::make_scope_exit([&run] { run.report.clock.pause(false); });
    run.graphed->step(batch.data, batch.target);
    run.tally.count(batch.target.numel());  // a replay does no host work of its own
  } else {
    run.tally.add(train_step(run, batch.data, batch.target), batch.target);
  }
}

// The graphed step: the eager step itself (train_step, added to the run's tally), captured. One worker
// only: DDP's collectives are not captured. The CPU runs the same step eagerly with --host-reads log-points,
// reading as a GPU run reads.
std::unique_ptr<detail::GraphedTrainStep> make_graphed_step(Run& run) {
  TORCH_CHECK(run.workers.world == 1,
              "TrainOptions::cuda_graphs: one worker only for now (DDP's collectives are "
              "not captured); use --nproc 1, or drop --cuda-graphs (docs/gpu.md)");
  return std::make_unique<detail::GraphedTrainStep>([&run](const torch::Tensor& data, const torch::Tensor& target) {
    run.tally.add_on_device(train_step(run, data, target), target);
  });
}

}  // namespace ampp::train::detail
