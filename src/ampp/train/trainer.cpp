// ampp::train::train in named steps: set up the workers, build the run (data, model, optimizer,
// amp, sampler), resume, run the epochs (steps, evaluation, checkpoints), write the outputs.
#include <ampp/amp/initialize.h>
#include <ampp/dist/ddp.h>
#include <ampp/dist/process_group.h>
#include <ampp/dist/sampler.h>
#include <ampp/precision/dtype.h>
#include <ampp/train/allocator.h>
#include <ampp/train/batches.h>
#include <ampp/train/checkpoint.h>
#include <ampp/train/dataset.h>
#include <ampp/train/models.h>
#include <ampp/train/trainer.h>
#include <ampp/util/parse_number.h>
#include <ampp/util/threads.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/schedulers/step_lr.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

namespace fs = std::filesystem;

namespace ampp::train {
namespace {

using Clock = std::chrono::steady_clock;
using Ddp = dist::DistributedDataParallel<std::shared_ptr<ClassifierImpl>>;

// An integer environment variable; `fallback` when unset. A malformed value is an error, not 0.
int64_t env_int(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  const auto value = parse_int(text);
  TORCH_CHECK(value, "environment variable ", name, "='", text, "' is not an integer");
  return *value;
}

// Sums a small float64 vector over all ranks (no-op without a group).
void allreduce_sum(const dist::ProcessGroup& pg, torch::Tensor& t) {
  if (!pg || pg.size() == 1) return;
  std::vector<torch::Tensor> v{t};
  pg.c10d()->allreduce(v)->wait();
}

EpochSums global_totals(const dist::ProcessGroup& pg, const EpochSums& sums) {
  auto t = torch::tensor({sums.loss_sum, sums.correct, sums.seen}, torch::kFloat64);
  allreduce_sum(pg, t);
  return {t[0].item<double>(), t[1].item<double>(), t[2].item<double>()};
}

// This process's place among the workers and its compute threads.
struct Workers {
  dist::ProcessGroup pg;
  int rank = 0;
  int world = 1;
  int threads = 1;
  bool restarted = false;  // a later attempt under `ampp run --max-restarts`
  bool leader() const { return rank == 0; }
};

Workers set_up_workers(const TrainOptions& o) {
  Workers w;
  if (env_int("WORLD_SIZE", 1) > 1) w.pg = dist::is_initialized() ? dist::default_group() : dist::init_process_group();
  w.rank = w.pg ? w.pg.rank() : 0;
  w.world = w.pg ? w.pg.size() : 1;
  const int local_world = w.pg ? w.pg.local_size() : 1;
  w.threads = o.threads() > 0 ? o.threads() : static_cast<int>(env_int("OMP_NUM_THREADS", 0));
  if (w.threads <= 0) w.threads = threads_per_worker(local_world);
  set_compute_threads(w.threads);  // LibTorch and OpenBLAS pools alike (util/threads.h)
  if (o.deterministic()) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  w.restarted = env_int("TORCHELASTIC_RESTART_COUNT", 0) > 0;
  return w;
}

// The opt level's Properties with this run's dtype and loss scale.
Properties amp_properties(const TrainOptions& o) {
  Properties props(o.opt_level());
  if (o.opt_level() != OptLevel::O0) props.dtype(o.dtype());
  if (o.loss_scale()) props.loss_scale(*o.loss_scale());
  props.verbosity(0);  // skipped steps are shown by the progress bar and metrics instead
  return props;
}

ModelOptions model_options_for(const Dataset& train) {
  const auto& img = train.images;
  return ModelOptions().in_channels(img.size(1)).height(img.size(2)).width(img.size(3)).num_classes(train.num_classes);
}

std::shared_ptr<ClassifierImpl> seeded_model(const TrainOptions& o, const ModelOptions& model_options) {
  torch::manual_seed(o.seed());
  return make_model(o.model(), model_options);
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Everything one worker's run holds, built in the order the seeds build it.
struct Run {
  Run(const TrainOptions& options, Workers workers_in)
      : o(options),
        workers(std::move(workers_in)),
        data(load_dataset(o.data(), o.seed())),
        per_rank_batch(o.batch_size() / workers.world),  // seed 000: int(batch_size / ngpus_per_node)
        model_options(model_options_for(data.train)),
        model(seeded_model(o, model_options)),
        optimizer(model->parameters(),
                  torch::optim::SGDOptions(o.lr()).momentum(o.momentum()).weight_decay(o.weight_decay())),
        amp(initialize(std::static_pointer_cast<torch::nn::Module>(model), optimizer, amp_properties(o))),
        sampler(static_cast<size_t>(data.train.size()),
                dist::DistributedSamplerOptions().num_replicas(workers.world).rank(workers.rank).seed(o.seed())),
        checkpoint(o.checkpoint_dir().empty() ? "" : checkpoint_path(o)) {
    TORCH_CHECK(per_rank_batch >= 1, "TrainOptions::batch_size ", o.batch_size(),
                " is smaller than the number of workers (", workers.world, "); use at least one image per worker");
    if (o.lr_step() > 0) scheduler.emplace(optimizer, static_cast<unsigned>(o.lr_step()), o.lr_gamma());
  }

  TrainingObjects objects() { return {*model, optimizer, amp, sampler}; }
  double elapsed() const { return position.elapsed + std::chrono::duration<double>(Clock::now() - started).count(); }
  void say(const std::string& line) const {
    if (!workers.leader() || !o.progress()) return;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  const TrainOptions& o;
  Workers workers;
  DatasetPair data;
  int64_t per_rank_batch;
  ModelOptions model_options;
  std::shared_ptr<ClassifierImpl> model;
  torch::optim::SGD optimizer;
  Amp amp;
  dist::DistributedSampler sampler;
  std::optional<torch::optim::StepLR> scheduler;
  std::optional<Ddp> ddp;
  std::string checkpoint;  // "" = no checkpoints
  RunPosition position;    // epoch/batch to start from; elapsed = seconds before this process
  EpochSums sums;          // the current epoch's running sums (this rank's; global totals on rank 0 after a save)
  bool resumed = false;
  std::optional<MetricsWriter> metrics;
  Clock::time_point started = Clock::now();  // reset when training starts (after resume and DDP)
  int64_t kill_at_step = -1;                 // see AMPP_TRAIN_TEST_KILL_AT_STEP in train()
  int64_t epochs_done = 0;
  double last_train_loss = 0;
  Evaluation last_eval;
};

// ---- small helpers ----

std::string fingerprint(const TrainOptions& o, int world) {
  return fmt::format("model={} data={} opt_level={} dtype={} batch_size={} world_size={} seed={}", o.model(),
                     o.data().empty() ? "fashion-mnist" : o.data(), to_string(o.opt_level()), c10::toString(o.dtype()),
                     o.batch_size(), world, o.seed());
}

std::string precision_label(const TrainOptions& o, const Amp& amp) {
  if (o.opt_level() == OptLevel::O0) return "O0 (fp32)";
  return fmt::format("{} {}{}, loss scale {}", to_string(o.opt_level()), low_precision_dtype_name(o.dtype()),
                     amp.fp16_emulated() ? " (emulated on CPU)" : "", amp.properties().loss_scale().to_string());
}

double current_lr(torch::optim::Optimizer& opt) {
  return static_cast<torch::optim::SGDOptions&>(opt.param_groups().front().options()).lr();
}

bool reached_step_limit(const Run& run) { return run.o.steps() > 0 && run.position.global_step >= run.o.steps(); }

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

// ---- resume and checkpoints ----

// Continues from the checkpoint when asked to (or restarted by the launcher) and one exists.
void resume(Run& run) {
  if (run.checkpoint.empty() || !(run.o.resume() || run.workers.restarted)) return;
  if (!fs::exists(run.checkpoint)) {
    run.say(fmt::format("no checkpoint at {} yet: starting from scratch", run.checkpoint));
    return;
  }
  TrainingCheckpoint saved(run.checkpoint);
  const std::string expected = fingerprint(run.o, run.workers.world);
  TORCH_CHECK(saved.position().fingerprint == expected, "checkpoint '", run.checkpoint,
              "' belongs to a different run (", saved.position().fingerprint, ") than this one (", expected,
              "); use the same options to resume, or another TrainOptions::checkpoint_dir to start afresh");
  // StepLR keeps its count privately: replay the finished epochs, then the saved optimizer state
  // (which holds the same lr) overrides whatever the replay set.
  if (run.scheduler)
    for (int64_t e = 0; e < saved.position().epoch; ++e) run.scheduler->step();
  saved.restore(run.objects());
  run.position = saved.position();
  run.sums = run.workers.leader() ? run.position.epoch_sums : EpochSums{};  // global totals live on rank 0
  run.resumed = true;
  run.say(fmt::format("resumed from {}: epoch {}, batch {}, step {}", run.checkpoint, run.position.epoch + 1,
                      run.position.batch, run.position.global_step));
}

// Running sums become global totals held by rank 0, so any world size resumes them exactly.
void save(Run& run, int64_t epoch, int64_t batch) {
  const EpochSums totals = global_totals(run.workers.pg, run.sums);
  run.sums = run.workers.leader() ? totals : EpochSums{};
  if (!run.workers.leader()) return;
  RunPosition now;
  now.fingerprint = fingerprint(run.o, run.workers.world);
  now.epoch = epoch;
  now.batch = batch;
  now.global_step = run.position.global_step;
  now.skipped_total = run.position.skipped_total;
  now.elapsed = run.elapsed();
  now.epoch_sums = run.sums;
  save_training_checkpoint(run.checkpoint, run.objects(), now);
}

// ---- one epoch ----

// Test loss/accuracy: each rank takes a contiguous slice (no padding, so every image counts
// once), then sums are all-reduced.
Evaluation evaluate(Run& run) {
  torch::NoGradGuard no_grad;
  run.model->eval();
  const Dataset& test = run.data.test;
  const int64_t n = test.size(), batch = 512;
  const int64_t begin = n * run.workers.rank / run.workers.world, end = n * (run.workers.rank + 1) / run.workers.world;
  double loss_sum = 0, correct = 0;
  for (int64_t i = begin; i < end; i += batch) {
    const int64_t j = std::min(end, i + batch);
    auto x = test.images.slice(0, i, j);
    auto y = test.labels.slice(0, i, j);
    torch::Tensor logits;
    {
      auto region = run.amp.autocast();
      logits = run.amp.cast_output(run.model->forward(run.amp.cast_input(x))).to(torch::kFloat32);
    }
    namespace F = torch::nn::functional;
    loss_sum += F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
    correct += logits.argmax(1).eq(y).sum().item<double>();
  }
  auto sums = torch::tensor({loss_sum, correct}, torch::kFloat64);
  allreduce_sum(run.workers.pg, sums);
  run.model->train();
  return {sums[0].item<double>() / n, 100.0 * sums[1].item<double>() / n};
}

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

struct StepResult {
  torch::Tensor logits;
  double loss = 0;
  bool stepped = false;  // false: skipped after an overflow
};

StepResult train_step(Run& run, const Batch& batch) {
  Amp& amp = run.amp;
  amp.zero_grad();  // same result as opt.zero_grad(), without the memset and add (amp/handle.h)
  torch::Tensor logits = run.ddp ? amp.forward(*run.ddp, batch.data) : amp.forward(run.model, batch.data);
  logits = logits.to(torch::kFloat32);
  auto loss = torch::nn::functional::cross_entropy(logits, batch.target);
  amp.scale_loss(loss).backward();
  if (run.o.clip_grad_norm() > 0) torch::nn::utils::clip_grad_norm_(amp.master_params(), run.o.clip_grad_norm());
  const bool stepped = amp.step();
  return {logits, loss.item<double>(), stepped};
}

void count_step(Run& run, const StepResult& step, const Batch& batch) {
  ++run.position.global_step;
  if (!step.stepped) ++run.position.skipped_total;
  if (run.position.global_step == run.kill_at_step) std::raise(SIGKILL);  // fault injection for the recovery test
  const auto images = batch.target.size(0);
  run.sums.loss_sum += step.loss * images;
  run.sums.correct += step.logits.argmax(1).eq(batch.target).sum().item<double>();
  run.sums.seen += images;
}

void log_step(Run& run, int64_t epoch, const StepResult& step, double images_per_sec) {
  StepRecord r;
  r.epoch = epoch;
  r.step = run.position.global_step;
  r.loss = step.loss;
  r.loss_scale = run.amp.loss_scale();
  r.skipped = !step.stepped;
  r.skipped_total = run.position.skipped_total;
  r.lr = current_lr(run.optimizer);
  r.images_per_sec = images_per_sec;
  r.elapsed = run.elapsed();
  run.metrics->write(r);
}

// The epoch's steps, until its end or TrainOptions::steps; checkpoints every checkpoint_every steps
// and where the step limit stops it mid-epoch.
void train_batches(Run& run, int64_t epoch, BatchIterator& batches, ProgressBar* bar) {
  const auto& o = run.o;
  const int64_t images_per_step = run.per_rank_batch * run.workers.world;
  Throughput meter;
  while (auto batch = batches.next()) {
    const StepResult step = train_step(run, *batch);
    count_step(run, step, *batch);
    ++meter.steps;
    const bool epoch_end = batches.position() == batches.num_batches();
    const bool log_now = !step.stepped || run.position.global_step % o.log_every() == 0 || epoch_end;
    if (log_now || bar) meter.update(log_now, images_per_step);
    if (log_now && run.metrics) log_step(run, epoch, step, meter.images_per_sec);
    if (bar)
      bar->update(batches.position(), meter.images_per_sec, step.loss, run.amp.loss_scale(),
                  run.position.skipped_total);
    const bool stop = reached_step_limit(run);
    const bool periodic = o.checkpoint_every() > 0 && run.position.global_step % o.checkpoint_every() == 0;
    if (!run.checkpoint.empty() && !epoch_end && (stop || periodic)) save(run, epoch, batches.position());
    if (stop) break;
  }
}

struct EpochStart {
  Clock::time_point time = Clock::now();
  int64_t global_step = 0;
};

// A finished epoch: StepLR, the epoch record and progress line, the epoch-end checkpoint.
void end_epoch(Run& run, int64_t epoch, const EpochSums& totals, const EpochStart& start, ProgressBar* bar) {
  if (run.scheduler) run.scheduler->step();
  run.epochs_done = epoch + 1;
  const double seconds = std::chrono::duration<double>(Clock::now() - start.time).count();
  const double train_accuracy = 100.0 * totals.correct / std::max(totals.seen, 1.0);
  if (run.metrics) {
    EpochRecord r;
    r.epoch = epoch;
    r.steps = run.position.global_step;
    r.train_loss = run.last_train_loss;
    r.train_accuracy = train_accuracy;
    r.test_loss = run.last_eval.loss;
    r.test_accuracy = run.last_eval.accuracy;
    r.seconds = seconds;
    r.images_per_sec = (run.position.global_step - start.global_step) * run.per_rank_batch * run.workers.world /
                       std::max(seconds, 1e-9);
    r.skipped_total = run.position.skipped_total;
    r.loss_scale = run.amp.loss_scale();
    r.lr = current_lr(run.optimizer);
    run.metrics->write(r);
  }
  if (bar) {
    bar->finish(fmt::format(
        "epoch {}/{}: train loss {:.4f}, train acc {:.2f}%, test loss {:.4f}, test acc {:.2f}% ({:.1f} s)", epoch + 1,
        run.o.epochs(), run.last_train_loss, train_accuracy, run.last_eval.loss, run.last_eval.accuracy, seconds));
  }
  if (!run.checkpoint.empty()) {
    run.sums = {};
    save(run, epoch + 1, 0);
  }
}

// One epoch; false when TrainOptions::steps stopped it before its end (the checkpoint written
// there holds the position).
bool run_epoch(Run& run, int64_t epoch, bool tty) {
  BatchIterator batches = epoch_batches(run, epoch);
  std::optional<ProgressBar> bar;
  if (run.workers.leader() && run.o.progress()) bar.emplace(epoch, run.o.epochs(), batches.num_batches(), tty);
  const EpochStart start{Clock::now(), run.position.global_step};
  train_batches(run, epoch, batches, bar ? &*bar : nullptr);
  const EpochSums totals = global_totals(run.workers.pg, run.sums);
  run.last_train_loss = totals.loss_sum / std::max(totals.seen, 1.0);
  run.last_eval = evaluate(run);
  if (batches.position() != batches.num_batches()) return false;
  end_epoch(run, epoch, totals, start, bar ? &*bar : nullptr);
  return true;
}

// ---- outputs ----

void open_outputs(Run& run) {
  if (run.workers.leader()) {
    fs::create_directories(run.o.out());
    run.metrics.emplace((fs::path(run.o.out()) / "metrics.jsonl").string(), /*append=*/run.resumed);
  }
  run.say(fmt::format("ampp train: {} on {}; {}; {} worker(s) x {} images/batch, {} thread(s) each", run.o.model(),
                      run.data.description, precision_label(run.o, run.amp), run.workers.world, run.per_rank_batch,
                      run.workers.threads));
}

// model.pt is written in FP32 so that a freshly built model loads it: under O2/O3 the trained
// module holds bf16 tensors, and Module::load() into FP32 tensors would not convert them. The
// values are exactly the evaluated model's (bf16 and fp16 widen to FP32 without rounding).
void save_fp32_model(ClassifierImpl& model, const Run& run, const std::string& path) {
  auto copy = make_model(run.o.model(), run.model_options);  // draws from the global RNG: training is over
  torch::NoGradGuard no_grad;
  auto src = model.named_parameters(), dst = copy->named_parameters();
  for (auto& item : dst) item.value().copy_(src[item.key()]);
  auto src_buffers = model.named_buffers(), dst_buffers = copy->named_buffers();
  for (auto& item : dst_buffers) item.value().copy_(src_buffers[item.key()]);
  torch::serialize::OutputArchive archive;
  copy->save(archive);
  archive.save_to(path);
}

Summary summarize(const Run& run) {
  Summary s;
  s.model = run.o.model();
  s.data = run.data.description;
  s.precision = precision_label(run.o, run.amp);
  s.world_size = run.workers.world;
  s.compute = describe_compute_threads();
  s.epochs = run.epochs_done;
  s.steps = run.position.global_step;
  s.skipped_steps = run.position.skipped_total;
  s.test_accuracy = run.last_eval.accuracy;
  s.test_loss = run.last_eval.loss;
  s.train_loss = run.last_train_loss;
  s.seconds = run.elapsed();
  s.images_per_sec = s.seconds > 0 ? s.steps * run.per_rank_batch * run.workers.world / s.seconds : 0;
  s.final_scale = run.amp.loss_scale();
  s.peak_rss_mb = peak_rss_mb();
  return s;
}

// Rank 0: the summary line and file, model.pt, the summary table and the plots.
void write_outputs(Run& run, const Summary& summary) {
  if (!run.workers.leader()) return;
  const fs::path out(run.o.out());
  run.metrics->write_line(to_json(summary));
  std::ofstream(out / "summary.json") << to_json(summary).dump(2) << "\n";
  save_fp32_model(*run.model, run, (out / "model.pt").string());
  if (run.o.progress()) std::printf("\n%s", summary_table(summary).c_str());
  if (run.o.plots()) {
    try {
      const auto pngs = write_plots(run.metrics->path(), run.o.out());
      run.say(fmt::format("plots: {}", fmt::join(pngs, ", ")));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ampp train: warning: plots not written: %s\n", e.what());
    }
  }
  run.say(fmt::format("metrics: {}", run.metrics->path()));
}

}  // namespace

Summary train(const TrainOptions& options) {
  validate(options);
  retain_freed_memory();  // no page faults on the same activation buffers every step (allocator.h)
  Run run(options, set_up_workers(options));
  resume(run);
  // DDP after the resume, so its construction broadcast starts every rank from the loaded weights.
  if (run.workers.world > 1) run.ddp.emplace(run.model, run.workers.pg);
  run.started = Clock::now();
  open_outputs(run);
  // Testing aid: AMPP_TRAIN_TEST_KILL_AT_STEP=N makes the last rank SIGKILL itself after step N
  // of the first attempt, to test recovery under `ampp run --max-restarts`.
  if (run.workers.rank == run.workers.world - 1 && !run.workers.restarted)
    run.kill_at_step = env_int("AMPP_TRAIN_TEST_KILL_AT_STEP", -1);
  run.epochs_done = run.position.epoch;
  run.model->train();
  const bool tty = is_terminal(stdout);
  for (int64_t epoch = run.position.epoch; epoch < options.epochs() && !reached_step_limit(run); ++epoch) {
    if (!run_epoch(run, epoch, tty)) break;
  }
  const Summary summary = summarize(run);
  write_outputs(run, summary);
  if (run.workers.pg) run.workers.pg.barrier();
  return summary;
}

}  // namespace ampp::train
