// ampp::train::train in named steps: set up the workers, build the run (data, model, optimizer,
// amp, sampler), resume, run the epochs (steps, evaluation, checkpoints), write the outputs.
#include "checkpoints.h"
#include "divergence.h"
#include "evaluation.h"
#include "outputs.h"
#include "process_settings.h"
#include "resume.h"
#include "run.h"
#include "train_step.h"
#include "workers.h"

namespace ampp::train::detail {

namespace {

// Images per second over the last interval of at least 0.2 s, or up to a logged step.
struct Throughput {
  Clock::time_point since = Clock::now();
  int64_t steps = 0;
  double images_per_sec = 0;

  void update(bool logged_step, int64_t images_per_step) {
    const double dt = std::chrono::duration<double>(Clock::now() - since).count();
    if (dt <= 0.2 && !logged_step && images_per_sec != 0) return;
    images_per_sec = steps * images_per_step / std::max(dt, 1e-9);
    since = Clock::now();
    steps = 0;
  }
};

BatchIterator epoch_batches(Run& run, int64_t epoch) {
  run.sampler.set_epoch(epoch);
  const auto idx = run.sampler.indices();
  BatchIterator batches(run.data.train, std::vector<int64_t>(idx.begin(), idx.end()), run.per_rank_batch,
                        /*drop_last=*/true);
  TORCH_CHECK(batches.num_batches() > 0, "each worker has only ", idx.size(),
              " training images, fewer than its batch of ", run.per_rank_batch,
              "; lower TrainOptions::batch_size or use more data");
  if (epoch == run.position.epoch && run.position.batch > 0) {
    batches.skip_to(run.position.batch);  // resumed mid-epoch: the sums were restored too
  } else {
    run.sums = {};
  }
  return batches;
}

// How the epoch's batches reach the step: on a GPU prepared one ahead by a loader thread (TrainOptions::
// prefetch_batches) and copied on a side stream, from pinned memory (TrainOptions::pinned_batches). On the
// CPU a batch is one gather, about 1% of a step (docs/gpu.md), and a loader thread there would compete with
// the step's threads for the cores: only --prefetch turns it on there.
PrefetchOptions batch_loading(const Run& run) {
  const bool on_host = run.data.train.images.device().is_cpu();  // on the GPU, a batch is one gather there
  const bool loader_thread = uses_loader_thread(run.o, run.device.is_cuda()) && on_host;
  return PrefetchOptions(run.device).pinned(run.o.pinned_batches()).background(loader_thread);
}

void count_step(Run& run) {
  ++run.position.global_step;
  if (run.faults.after_step) run.faults.after_step(run.position.global_step);  // tests only (fault_injection.h)
}

void record_operators(Run& run, bool epoch_ended) {
  if (!run.report.op_recorder) return;
  const int64_t recorded = run.report.phases.steps - kOpWindowFirst;
  if (run.report.op_recorder->recording() && (recorded == kOpWindowSteps || epoch_ended)) {
    run.report.ops = run.report.op_recorder->stop(recorded);
  } else if (!run.report.ops && !run.report.op_recorder->recording() && !epoch_ended && recorded == 0) {
    run.report.op_recorder->start();
  }
}

// The epoch's steps, until its end or TrainOptions::steps; checkpoints every checkpoint_every steps
// and where the step limit stops it mid-epoch. The host reads the device's tally (StepTally) only every
// log_every steps, at the epoch's end, at the step limit and before a checkpoint, or every step where a read
// costs nothing: Note [what the host reads] (run.h).
void train_batches(Run& run, int64_t epoch, BatchPrefetcher& batches, ProgressBar* bar) {
  const auto& o = run.o;
  const int64_t images_per_step = run.per_rank_batch * run.workers.world;
  Throughput meter;
  run.report.clock.restart();  // between epochs: evaluation and checkpoints are not step time
  while (const auto next = batches.next()) {
    record_operators(run, false);
    run.report.clock.lap(StepPhase::kData);
    run_step(run, *next);
    count_step(run);
    dist::report_progress(run.position.global_step);
    ++meter.steps;
    const bool epoch_end = batches.position() == batches.num_batches(), stop = reached_step_limit(run);
    const bool saves = saves_mid_epoch(run, epoch_end, stop);
    const bool logged = run.position.global_step % o.log_every() == 0 || epoch_end;
    if (run.reads_every_step || logged || stop || saves) {
      const auto readout = run.tally.read(run.amp.ledger());
      run.report.clock.settle();  // the host waited for the GPU above: the device clock's laps are done
      run.report.steady.mark(readout.steps);
      const StepResult step = read_steps(run, readout);
      const bool log_now = logged || !step.stepped;
      if (log_now || bar) meter.update(log_now, images_per_step);
      if (log_now && run.report.metrics) log_step(run, epoch, step, meter.images_per_sec);
      if (bar)
        bar->update(batches.position(), meter.images_per_sec, step.loss, run.loss_scale(), run.position.skipped_total);
      check_divergence(run, step, readout);
    }
    if (saves) {
      save(run, epoch, batches.position());  // after a read: the sums and the scale are the step's
      run.report.steady.restart();           // a checkpoint is not step time
    }
    ++run.report.phases.steps;
    run.report.clock.lap(StepPhase::kBookkeeping);
    if (stop) break;
  }
  run.report.steady.end_segment();
  run.report.clock.settle();
  record_operators(run, true);
}

struct EpochStart {
  Clock::time_point time = Clock::now();
  int64_t global_step = 0;
};

// A finished epoch: the epoch record and progress line, the epoch-end checkpoint.
void end_epoch(Run& run, int64_t epoch, const EpochSums& totals, const EpochStart& start, ProgressBar* bar) {
  run.report.epochs_done = epoch + 1;
  const double seconds = std::chrono::duration<double>(Clock::now() - start.time).count();
  const double train_accuracy = 100.0 * totals.correct / std::max(totals.seen, 1.0);
  if (run.report.metrics) {
    EpochRecord r;
    r.epoch = epoch;
    r.steps = run.position.global_step;
    r.train_loss = run.report.last_train_loss;
    r.train_accuracy = train_accuracy;
    r.test_loss = run.report.last_eval.loss;
    r.test_accuracy = run.report.last_eval.accuracy;
    r.seconds = seconds;
    r.images_per_sec = (run.position.global_step - start.global_step) * run.per_rank_batch * run.workers.world /
                       std::max(seconds, 1e-9);
    r.skipped_total = run.position.skipped_total;
    r.loss_scale = run.loss_scale();
    r.lr = run.lr->last_lr();  // its last step's
    run.report.metrics->write(r);
    if (run.report.tensorboard) log_to_tensorboard(*run.report.tensorboard, r);
  }
  if (bar) {
    bar->finish(
        fmt::format("epoch {}/{}: train loss {:.4f}, train acc {:.2f}%, test loss {:.4f}, test acc {:.2f}% ({:.1f} s)",
                    epoch + 1, run.o.epochs(), run.report.last_train_loss, train_accuracy, run.report.last_eval.loss,
                    run.report.last_eval.accuracy, seconds));
  }
  if (!run.checkpoint.empty()) {
    run.sums = {};
    save(run, epoch + 1, 0);
  }
}

// One epoch; false when TrainOptions::steps stopped it before its end (the checkpoint written
// there holds the position).
bool run_epoch(Run& run, int64_t epoch, bool tty) {
  BatchIterator indexed = epoch_batches(run, epoch);
  run.lr->start_epoch(epoch);
  std::optional<ProgressBar> bar;
  if (run.workers.leader() && run.o.progress()) bar.emplace(epoch, run.o.epochs(), indexed.num_batches(), tty);
  const EpochStart start{Clock::now(), run.position.global_step};
  bool whole_epoch = false;
  {
    BatchPrefetcher batches(indexed, batch_loading(run));  // stopped before the evaluation
    train_batches(run, epoch, batches, bar ? &*bar : nullptr);
    whole_epoch = batches.position() == batches.num_batches();
  }
  const EpochSums totals = global_totals(run.workers.pg, run.sums);
  run.report.last_train_loss = totals.loss_sum / std::max(totals.seen, 1.0);
  run.report.last_eval = evaluate(run);
  if (!whole_epoch) return false;
  end_epoch(run, epoch, totals, start, bar ? &*bar : nullptr);
  return true;
}

}  // namespace

}  // namespace ampp::train::detail

namespace ampp::train {

Summary train(const TrainOptions& unresolved) {
  using namespace detail;
  const TrainOptions options = with_model_defaults(unresolved);
  validate(options);
  // Before any tensor exists, so that every one is counted.
  const TensorMemoryTracker* tracker = options.profile() ? &TensorMemoryTracker::install() : nullptr;
  retain_freed_memory();  // no page faults on the same activation buffers every step (allocator.h)
  const ProcessSettingsScope settings(options);  // deterministic algorithms, cuDNN's benchmark mode: this run's
  Workers workers = set_up_workers(options);
  const auto lock = claim_outputs(options, workers);  // before the data is loaded: fail in seconds
  Run run(options, std::move(workers));
  resume(run);
  resume_from_pytorch(run);
  if (run.resumed && nothing_left(run)) return finish_finished_run(run);
  // The skip ledger goes on from the checkpoint's counts: the lr's position (step_lr.h). Moved to the device
  // here, before the first step: the move is a copy the host waits for, which no step may make.
  run.amp.ledger().restore(steps_taken(run.position), run.position.skipped_total);
  run.amp.ledger().taken_on(run.device);
  // DDP after the resume, so its construction broadcast starts every rank from the loaded weights.
  if (run.workers.world > 1 && !run.fsdp) start_ddp(run);
  run.started = Clock::now();
  dist::report_progress(run.position.global_step);  // watched by the launcher from here on
  open_outputs(run);
  if (options.doctor() && run.workers.leader()) run.report.ranges.emplace();
  if (options.doctor() && options.fp8() && run.workers.leader()) run.report.fp8_ranges.emplace();
  if (options.profile() && run.workers.leader())
    run.report.op_recorder.emplace();  // DDP's gradients are alike on every rank
  run.faults = detail::faults_for(run.workers.rank, run.workers.world, run.workers.restarted);
  run.reads_every_step = reads_every_step(options, run.device.is_cuda());
  if (run.device.is_cuda()) run.report.clock.use_device(run.device);  // the GPU's time per phase, not the launches'
  if (options.cuda_graphs()) {
    run.graphed = make_graphed_step(run);
    run.say("CUDA graphs: each step is one graph replay");
  }
  run.report.epochs_done = run.position.epoch;
  run.model->train();
  const bool tty = is_terminal(stdout);
  for (int64_t epoch = run.position.epoch; epoch < options.epochs() && !reached_step_limit(run); ++epoch) {
    if (!run_epoch(run, epoch, tty)) break;
  }
  Summary summary = summarize(run);
  summary.step_phases = gather_step_phases(run);
  summary.ops = run.report.ops;
  if (tracker) {
    auto* zero = run.zero();
    summary.memory = measure_memory(*run.model, run.optimizer, zero ? zero->local_optimizer() : run.optimizer,
                                    run.amp.master_gradient_buffers(), run.data, *tracker);
  }
  // The whole model back in the module (FP32 under FSDP's default policy), for the checks and model.pt.
  if (run.fsdp) run.fsdp->unshard();
  const bool weights_finite = check_finite_weights(run);  // each may stop the run
  const bool loss_finite = check_final_loss(run);
  write_outputs(run, summary, weights_finite && loss_finite);
  if (run.workers.pg) run.workers.pg.barrier();
  return summary;
}

}  // namespace ampp::train
