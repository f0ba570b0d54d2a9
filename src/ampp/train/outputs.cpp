#include "outputs.h"

namespace ampp::train::detail {

void log_step(Run& run, int64_t epoch, const StepResult& step, double images_per_sec) {
  StepRecord r;
  r.epoch = epoch;
  r.step = run.position.global_step;
  r.loss = step.loss;
  r.loss_scale = run.loss_scale();
  r.skipped = !step.stepped;
  r.overflowed = step.overflowed;
  r.skipped_total = run.position.skipped_total;
  r.lr = run.lr->last_lr();  // the last step's (Note [the step's lr], step_lr.h)
  r.images_per_sec = images_per_sec;
  r.elapsed = run.elapsed();
  run.report.metrics->write(r);
  if (run.report.tensorboard) {
    log_to_tensorboard(*run.report.tensorboard, r);
    if (run.report.ranges) log_to_tensorboard(*run.report.tensorboard, *run.report.ranges, r.step);
  }
}

// Rank 0 under TrainOptions::doctor: doctor.json, the picture, and the recommendation on the terminal.
void write_doctor_outputs(const Run& run) {
  if (!run.report.ranges) return;
  for (const auto& line : doctor_summary(*run.report.ranges)) run.say(line);
  if (run.report.fp8_ranges)
    for (const auto& line : doctor_fp8_summary(*run.report.fp8_ranges)) run.say(line);
  if (run.report.first_non_finite.contains("origin") && !run.report.first_non_finite["origin"].is_null())
    run.say(fmt::format("doctor: step {}: {}", run.report.first_non_finite["step"].get<int64_t>(),
                        run.report.first_non_finite["origin"].get<std::string>()));
  try {
    const auto fp8 = run.report.fp8_ranges ? doctor_fp8_json(*run.report.fp8_ranges) : nlohmann::json();
    const auto written =
        write_doctor_report(*run.report.ranges, run.report.first_non_finite, fp8, run.o.out(), run.o.plots());
    run.say(fmt::format("doctor: {}", fmt::join(written, ", ")));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampp train: warning: the doctor's report was not written: %s\n", e.what());
  }
}

void open_outputs(Run& run) {
  if (run.workers.leader()) {
    fs::create_directories(run.o.out());
    // summary.json means "complete outputs": an earlier run's must not sit beside this run's partial ones.
    fs::remove(fs::path(run.o.out()) / "summary.json");
    run.report.metrics.emplace((fs::path(run.o.out()) / "metrics.jsonl").string(), /*append=*/run.resumed);
    if (!run.o.tensorboard().empty()) run.report.tensorboard.emplace(run.o.tensorboard());
  }
  run.say(fmt::format("ampp train: {} on {}; {}; {} worker(s) x {} {}/batch, {} thread(s) each", run.o.model(),
                      run.data.description, precision_label(run.o, run.amp, *run.model), run.workers.world,
                      run.per_rank_batch, run.data.train.tokens ? "sequences" : "images", run.workers.threads));
  if (run.data.unigram_loss)
    run.say(fmt::format("ampp train: the validation text's unigram baseline loss is {:.4f} (perplexity {:.2f})",
                        *run.data.unigram_loss, std::exp(*run.data.unigram_loss)));
  if (!run.report.data_placement.empty()) run.say(run.report.data_placement);
  if (!run.report.communication.empty()) run.say(run.report.communication);
  if (run.fsdp)
    run.say(
        fmt::format("FSDP: {} workers each keep 1/{} of the parameters, gradients and momentum; {} unit(s) "
                    "gathered one at a time",
                    run.workers.world, run.workers.world, run.model->sharding_units().size() + 1));
  if (run.o.fsdp() && run.workers.world == 1)
    run.say("ampp train: note: --fsdp shards the model over the workers, and this run has one: it trains unsharded");
  if (run.o.zero() && run.workers.world == 1)
    run.say(
        "ampp train: note: --zero shards the optimizer state over the workers, and this run has one: the state "
        "stays whole (run 2 or more workers with --nproc N to shard it)");
}

namespace {

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
  save_archive_atomic(archive, path);  // a full disk leaves the previous model.pt, not a truncated one
}

}  // namespace

Summary summarize(const Run& run) {
  Summary s;
  s.model = run.o.model();
  s.data = run.data.description;
  s.precision = precision_label(run.o, run.amp, *run.model);
  s.world_size = run.workers.world;
  s.compute = describe_compute_threads();
  s.epochs = run.report.epochs_done;
  s.steps = run.position.global_step;
  s.skipped_steps = run.position.skipped_total;
  s.test_accuracy = run.report.last_eval.accuracy;
  s.test_loss = run.report.last_eval.loss;
  s.train_loss = run.report.last_train_loss;
  s.seconds = run.elapsed();
  const auto images_per_step = static_cast<double>(run.per_rank_batch * run.workers.world);
  s.wall_images_per_sec = s.seconds > 0 ? static_cast<double>(s.steps) * images_per_step / s.seconds : 0;
  s.steady_steps = run.report.steady.seconds > 0 ? run.report.steady.steps : 0;
  s.images_per_sec = s.steady_steps > 0
                         ? static_cast<double>(run.report.steady.steps) * images_per_step / run.report.steady.seconds
                         : s.wall_images_per_sec;
  if (run.data.train.tokens) {
    s.tokens_per_sec = s.images_per_sec * static_cast<double>(run.data.train.images.size(1));
    s.unigram_loss = run.data.unigram_loss;
  }
  s.final_scale = run.loss_scale();
  s.peak_rss_mb = peak_rss_mb();
  return s;
}

// Every rank's StepPhases, on every rank (one allreduce: each rank fills its own row).
std::vector<StepPhases> gather_step_phases(const Run& run) {
  const auto world = static_cast<int64_t>(run.workers.world), columns = static_cast<int64_t>(kNumStepPhases) + 1;
  auto rows = torch::zeros({world, columns}, torch::kFloat64);
  for (size_t k = 0; k < kNumStepPhases; ++k)
    rows[run.workers.rank][static_cast<int64_t>(k)] = run.report.phases.seconds[k];
  rows[run.workers.rank][columns - 1] = static_cast<double>(run.report.phases.steps);
  allreduce_sum(run.workers.pg, rows);
  std::vector<StepPhases> ranks(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    for (size_t k = 0; k < kNumStepPhases; ++k) ranks[r].seconds[k] = rows[r][static_cast<int64_t>(k)].item<double>();
    ranks[r].steps = static_cast<int64_t>(rows[r][columns - 1].item<double>());
  }
  return ranks;
}

// Rank 0: model.pt, the summary line and file, the summary table and the plots. Every file is
// written atomically, summary.json last: its presence means the outputs are complete.
void write_outputs(Run& run, const Summary& summary, bool write_model) {
  if (!run.workers.leader()) return;
  const fs::path out(run.o.out());
  if (write_model)
    save_fp32_model(*run.model, run, (out / "model.pt").string());
  else
    run.say("model.pt was not written: the weights or the test loss are not finite (the diagnosis is the result)");
  run.report.metrics->write_line(to_json(summary));
  write_file_atomic((out / "summary.json").string(), to_json(summary).dump(2) + "\n");
  if (run.o.progress()) std::printf("\n%s", summary_table(summary).c_str());
  if (run.o.profile() && !summary.step_phases.empty())
    std::printf("\nwhere the step time went (TrainOptions::profile):\n%s",
                step_phases_table(summary.step_phases).c_str());
  if (run.o.profile() && summary.ops)
    std::printf("\nthe operators of steps %lld-%lld on rank 0 (LibTorch's profiler, by self time):\n%s",
                static_cast<long long>(kOpWindowFirst + 1), static_cast<long long>(kOpWindowFirst + summary.ops->steps),
                op_table(*summary.ops).c_str());
  if (run.o.profile() && summary.memory) std::printf("\n%s", memory_table(*summary.memory).c_str());
  if (run.o.plots()) {
    try {
      const auto pngs = write_plots(run.report.metrics->path(), run.o.out());
      run.say(fmt::format("plots: {}", fmt::join(pngs, ", ")));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ampp train: warning: plots not written: %s\n", e.what());
    }
  }
  write_doctor_outputs(run);
  run.say(fmt::format("metrics: {}", run.report.metrics->path()));
  if (run.report.tensorboard)
    run.say(fmt::format("tensorboard: {} (view: tensorboard --logdir {})", run.report.tensorboard->path(),
                        run.o.tensorboard()));
}

}  // namespace ampp::train::detail
