#include "resume.h"
#include "evaluation.h"
#include "outputs.h"
#include "workers.h"

#include <ampp/util/parse_number.h>

namespace ampp::train::detail {

namespace {

// The checkpoint's SGD hyperparameters (which loading put in force, as PyTorch's load_state_dict
// does) must be this run's: a silent change of momentum would be a different run. `source` names it.
void check_sgd_options(const torch::optim::SGDOptions& sgd, const TrainOptions& o, const std::string& source) {
  TORCH_CHECK(sgd.momentum() == o.momentum() && sgd.weight_decay() == *o.weight_decay(), source,
              " was trained with SGD momentum ", sgd.momentum(), " and weight decay ", sgd.weight_decay(),
              "; this run has momentum ", o.momentum(), " and weight decay ", *o.weight_decay(), ": pass --momentum ",
              sgd.momentum(), " --weight-decay ", sgd.weight_decay());
  TORCH_CHECK(sgd.dampening() == 0 && !sgd.nesterov(), source, " was trained with SGD dampening ", sgd.dampening(),
              (sgd.nesterov() ? " and Nesterov momentum" : ""), ", which ampp train's SGD does not use");
}

// The same for AdamW: its first group (the matrices) carries the weight decay, the betas are nanoGPT's.
void check_adamw_options(const torch::optim::AdamWOptions& adamw, const TrainOptions& o, const std::string& source) {
  const auto expected = adamw_options(o);
  TORCH_CHECK(adamw.weight_decay() == *o.weight_decay(), source, " was trained with AdamW weight decay ",
              adamw.weight_decay(), "; this run has ", *o.weight_decay(), ": pass --weight-decay ",
              adamw.weight_decay());
  TORCH_CHECK(adamw.betas() == expected.betas() && adamw.eps() == expected.eps() && !adamw.amsgrad(), source,
              " was trained with AdamW betas (", std::get<0>(adamw.betas()), ", ", std::get<1>(adamw.betas()),
              "), eps ", adamw.eps(), (adamw.amsgrad() ? " and amsgrad" : ""),
              ", which ampp train's AdamW does not use (betas (0.9, 0.95), eps 1e-8)");
}

// The optimizer the checkpoint put in force must be this run's kind, with this run's settings.
void check_optimizer_options(const Run& run, const std::string& source) {
  const auto& options = run.optimizer.param_groups().front().options();
  const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options);
  const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options);
  TORCH_CHECK(sgd || adamw, source, " left an optimizer that is neither SGD nor AdamW");
  if (sgd) check_sgd_options(*sgd, run.o, source);
  if (adamw) check_adamw_options(*adamw, run.o, source);
}

// FSDP: a checkpoint holds the unsharded model and SGD state (this run's, DDP's, or another world size's).
// `load` reads it into an unsharded copy, of which each rank then keeps its rows.
void load_into_shards(Run& run, const std::function<void(const TrainingObjects&)>& load) {
  const torch::Tensor rng = get_rng_state();  // building the copy draws initial weights: the run's stream stays
  const auto whole = make_model(run.o.model(), run.model_options);
  set_rng_state(rng);
  const auto optimizer = plain_optimizer(param_groups_for(whole->parameters(), run.o), run.o, false);
  load(TrainingObjects{*whole, *optimizer, run.amp, run.sampler});
  run.fsdp->load_full_state_dict(module_state_dict(*whole));
  run.fsdp->load_full_optimizer_state_dict(run.optimizer, optimizer_state_dict(*optimizer));
}

// The one difference a longer run makes to a checkpoint's identity, named with its fix: the cosine spans
// the run unless its length is given, so more --epochs or --steps make another curve.
void check_same_cosine(const std::string& saved, const Run& run) {
  const std::string key = " lr_decay_steps=";
  const auto at = saved.find(key);
  if (at == std::string::npos || run.o.lr_decay_steps() > 0) return;
  const auto start = at + key.size();
  const auto saved_steps = parse_int(saved.substr(start, saved.find(' ', start) - start));
  if (!saved_steps || *saved_steps == run.cosine_steps || !same_run(saved, run.o, run.workers.world, *saved_steps))
    return;
  TORCH_CHECK(false, "checkpoint '", run.checkpoint, "' was written by a run whose cosine schedule decays over ",
              *saved_steps, " steps, and this one's would decay over ", run.cosine_steps,
              " (without TrainOptions::lr_decay_steps the cosine spans the run, and its length changed): set "
              "TrainOptions::lr_decay_steps to ",
              *saved_steps, " to continue on its curve");
}

}  // namespace

// Continues from the checkpoint when asked to (or restarted by the launcher) and one exists.
void resume(Run& run) {
  if (run.checkpoint.empty() || !(run.o.resume() || run.workers.restarted)) return;
  if (!fs::exists(run.checkpoint)) {
    run.say(fmt::format("no checkpoint at {} yet: starting from scratch", run.checkpoint));
    return;
  }
  TrainingCheckpoint saved(run.checkpoint, run.device);  // this rank's device, not the saving rank's
  check_same_cosine(saved.position().fingerprint, run);
  const std::string expected = fingerprint(run.o, run.workers.world, run.cosine_steps);
  TORCH_CHECK(same_run(saved.position().fingerprint, run.o, run.workers.world, run.cosine_steps), "checkpoint '",
              run.checkpoint, "' belongs to a different run (", saved.position().fingerprint, ") than this one (",
              expected, "); use the same options to resume, or another TrainOptions::checkpoint_dir to start afresh");
  if (run.fsdp)
    load_into_shards(run, [&](const TrainingObjects& whole) { saved.restore(whole); });
  else
    saved.restore(run.objects());  // the lr follows from the position (scheduled_lr)
  check_optimizer_options(run, "checkpoint '" + run.checkpoint + "'");
  run.position = saved.position();
  run.sums = run.workers.leader() ? run.position.epoch_sums : EpochSums{};  // global totals live on rank 0
  run.resumed = true;
  run.say(fmt::format("resumed from {}: epoch {}, batch {}, step {}", run.checkpoint, run.position.epoch + 1,
                      run.position.batch, run.position.global_step));
}

// Continues from a PyTorch-format file (TrainOptions::resume_from), unless the run resumed from its own
// checkpoint: a restarted worker continues from where this run got to, not from the file.
void resume_from_pytorch(Run& run) {
  const std::string& path = run.o.resume_from();
  if (path.empty() || run.resumed) return;
  TORCH_CHECK(fs::is_regular_file(path), "TrainOptions::resume_from: no file '", path, "'");
  // Under ZeRO and FSDP the file's state goes into an unsharded optimizer first; each rank then keeps its
  // shard's.
  PyTorchCheckpointContents c;
  auto* zero = run.zero();
  std::unique_ptr<torch::optim::Optimizer> unsharded;
  if (zero) unsharded = plain_optimizer(run.optimizer.param_groups(), run.o, false);
  if (run.fsdp)
    load_into_shards(run, [&](const TrainingObjects& whole) { c = load_pytorch_training_checkpoint(path, whole); });
  else
    c = load_pytorch_training_checkpoint(path, {*run.model, zero ? *unsharded : run.optimizer, run.amp, run.sampler});
  if (zero) zero->load_from(*unsharded);
  if (c.optimizer) check_optimizer_options(run, "PyTorch checkpoint '" + path + "'");
  run.position.epoch = c.epoch;
  run.position.batch = c.batch;
  run.position.global_step = c.step;
  run.position.skipped_total = c.skipped_steps;
  if (c.weights_only) {
    run.say(
        fmt::format("started from the weights in {} (a model state_dict: optimizer, loss scale and position "
                    "start afresh)",
                    path));
    return;
  }
  run.say(fmt::format("continued from {}: epoch {}, batch {}, step {}{}{}", path, c.epoch + 1, c.batch, c.step,
                      c.optimizer ? ", optimizer state" : ", no optimizer state",
                      c.scaler ? fmt::format(", loss scale {}", run.amp.loss_scale()) : ""));
}

bool nothing_left(const Run& run) { return reached_step_limit(run) || run.position.epoch >= run.o.epochs(); }

namespace {

// The complete outputs of the finished run in the checkpoint, if `out` holds them.
std::optional<Summary> stored_summary(const Run& run) {
  const fs::path path = fs::path(run.o.out()) / "summary.json";
  if (!fs::exists(path)) return std::nullopt;
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || j.value("type", "") != "summary" || j.value("steps", int64_t{-1}) != run.position.global_step)
    return std::nullopt;
  return summary_from_json(j);
}

}  // namespace

// Resuming a run that already finished changes nothing: its stored summary is the result. When
// its outputs are missing (a worker died between the last checkpoint and summary.json), they are
// rebuilt from the checkpoint: the same model, a deterministic evaluation, the stored train loss.
Summary finish_finished_run(Run& run) {
  std::optional<Summary> stored;
  on_leader_agreed(run.workers, [&] { stored = stored_summary(run); });
  auto found = torch::tensor({stored ? 1.0 : 0.0}, torch::kFloat64);
  allreduce_sum(run.workers.pg, found);
  // Every rank computes the final numbers (collectives), as the run's last epoch did.
  run.report.epochs_done = run.position.epoch;
  const EpochSums totals = global_totals(run.workers.pg, run.sums);
  run.report.last_train_loss =
      run.position.batch > 0 ? totals.loss_sum / std::max(totals.seen, 1.0) : run.position.last_train_loss;
  run.report.last_eval = evaluate(run);
  if (found.item<double>() > 0) {
    run.say(fmt::format("the run in {} already finished (epoch {}, step {}): nothing to do; its results are in {}",
                        run.checkpoint, run.position.epoch, run.position.global_step, run.o.out()));
    return stored ? *stored : summarize(run);
  }
  run.say("the run already finished but its outputs are incomplete: writing them from the checkpoint");
  open_outputs(run);
  const Summary summary = summarize(run);
  write_outputs(run, summary);
  return summary;
}

}  // namespace ampp::train::detail
