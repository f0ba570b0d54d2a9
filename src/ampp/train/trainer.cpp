#include "ampp/train/trainer.h"

#include <ampp/dist/ddp.h>
#include <ampp/dist/process_group.h>
#include <ampp/dist/sampler.h>
#include <ampp/initialize.h>
#include <ampp/train/allocator.h>
#include <ampp/train/batches.h>
#include <ampp/train/checkpoint.h>
#include <ampp/train/dataset.h>
#include <ampp/train/models.h>
#include <ampp/util/threads.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/schedulers/step_lr.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

namespace fs = std::filesystem;

namespace ampp::train {
namespace {

using Clock = std::chrono::steady_clock;
using Ddp = dist::DistributedDataParallel<std::shared_ptr<ClassifierImpl>>;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::atoi(v) : fallback;
}

// Sums a small float64 vector over all ranks (no-op without a group).
void allreduce_sum(const dist::ProcessGroup& pg, torch::Tensor& t) {
  if (!pg || pg.size() == 1) return;
  std::vector<torch::Tensor> v{t};
  pg.c10d()->allreduce(v)->wait();
}

// Per-epoch running sums, kept as globally reduced totals on rank 0 at checkpoints (see save).
struct EpochSums {
  double loss_sum = 0, correct = 0, seen = 0;
};

struct Evaluation {
  double loss = 0, accuracy = 0;
};

// Test loss/accuracy: each rank takes a contiguous slice (no padding, so every image counts
// once), then sums are all-reduced.
Evaluation evaluate(ClassifierImpl& model, Amp& amp, const Dataset& test, int64_t batch, const dist::ProcessGroup& pg,
                    int rank, int world) {
  torch::NoGradGuard no_grad;
  model.eval();
  const int64_t n = test.size();
  const int64_t begin = n * rank / world, end = n * (rank + 1) / world;
  double loss_sum = 0, correct = 0;
  for (int64_t i = begin; i < end; i += batch) {
    const int64_t j = std::min(end, i + batch);
    auto x = test.images.slice(0, i, j);
    auto y = test.labels.slice(0, i, j);
    torch::Tensor logits;
    {
      auto region = amp.autocast();
      logits = amp.cast_output(model.forward(amp.cast_input(x))).to(torch::kFloat32);
    }
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(y).sum().item<double>();
  }
  auto sums = torch::tensor({loss_sum, correct}, torch::kFloat64);
  allreduce_sum(pg, sums);
  model.train();
  return {sums[0].item<double>() / n, 100.0 * sums[1].item<double>() / n};
}

std::string precision_label(const TrainOptions& o, const Amp& amp) {
  if (o.opt_level() == "O0") return "O0 (fp32)";
  const auto& p = amp.properties();
  const LossScale ls = p.loss_scale();
  return fmt::format("{} {}{}, loss scale {}", o.opt_level(), o.dtype() == c10::kHalf ? "fp16" : "bf16",
                     amp.fp16_emulated() ? " (emulated on CPU)" : "", ls.to_string());
}

double current_lr(torch::optim::Optimizer& opt) {
  return static_cast<torch::optim::SGDOptions&>(opt.param_groups().front().options()).lr();
}

// Identity of a run: resuming with a different one is refused.
std::string fingerprint(const TrainOptions& o, int world) {
  return fmt::format("model={} data={} opt_level={} dtype={} batch_size={} world_size={} seed={}", o.model(),
                     o.data().empty() ? "fashion-mnist" : o.data(), o.opt_level(), c10::toString(o.dtype()),
                     o.batch_size(), world, o.seed());
}

}  // namespace

void validate(const TrainOptions& o) {
  const auto& names = model_names();
  TORCH_CHECK(std::find(names.begin(), names.end(), o.model()) != names.end(), "--model '", o.model(),
              "' is unknown; choose one of: mlp, cnn, resnet");
  TORCH_CHECK(o.opt_level() == "O0" || o.opt_level() == "O1" || o.opt_level() == "O2" || o.opt_level() == "O3",
              "--opt-level '", o.opt_level(), "' is invalid; use O0, O1, O2 or O3 (capital letter O)");
  TORCH_CHECK(o.dtype() == c10::kHalf || o.dtype() == c10::kBFloat16, "--dtype must be bf16 or fp16");
  if (!o.loss_scale().empty() && o.loss_scale() != "dynamic") {
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(o.loss_scale(), &used);
      if (used != o.loss_scale().size()) v = -1;
    } catch (...) {
      v = -1;
    }
    TORCH_CHECK(v > 0 && std::isfinite(v), "--loss-scale '", o.loss_scale(),
                "' is invalid; use 'dynamic' or a positive number such as 128");
  }
  TORCH_CHECK(o.batch_size() >= 1, "--batch-size must be at least 1, got ", o.batch_size());
  TORCH_CHECK(o.epochs() >= 1, "--epochs must be at least 1, got ", o.epochs());
  TORCH_CHECK(o.steps() >= 0, "--steps must be 0 (no limit) or positive, got ", o.steps());
  TORCH_CHECK(o.lr() > 0 && std::isfinite(o.lr()), "--lr must be a positive number, got ", o.lr());
  TORCH_CHECK(o.momentum() >= 0 && o.momentum() < 1, "--momentum must be in [0, 1), got ", o.momentum());
  TORCH_CHECK(o.weight_decay() >= 0 && std::isfinite(o.weight_decay()), "--weight-decay must be >= 0, got ",
              o.weight_decay());
  TORCH_CHECK(o.lr_step() >= 0, "--lr-step must be 0 (constant lr) or a positive number of epochs, got ", o.lr_step());
  TORCH_CHECK(o.lr_gamma() > 0 && o.lr_gamma() <= 1, "--lr-gamma must be in (0, 1], got ", o.lr_gamma());
  TORCH_CHECK(o.clip_grad_norm() >= 0 && std::isfinite(o.clip_grad_norm()),
              "--clip-grad-norm must be 0 (off) or a positive max norm, got ", o.clip_grad_norm());
  TORCH_CHECK(o.threads() >= 0 && o.threads() <= 1024, "--threads must be 0 (automatic) or a positive count, got ",
              o.threads());
  TORCH_CHECK(o.checkpoint_every() >= 0, "--checkpoint-every must be 0 (every epoch only) or a positive number of steps");
  TORCH_CHECK(!(o.checkpoint_every() > 0 && o.checkpoint_dir().empty()),
              "--checkpoint-every needs --checkpoint-dir DIR (where to write the checkpoints)");
  TORCH_CHECK(!(o.resume() && o.checkpoint_dir().empty()), "--resume needs --checkpoint-dir DIR (where the checkpoint is)");
  TORCH_CHECK(!o.out().empty(), "--out must name a folder");
  TORCH_CHECK(o.log_every() >= 1, "--log-every must be at least 1");
}

// model.pt is written in FP32 so that a freshly built model loads it: under O2/O3 the trained
// module holds bf16 tensors, and Module::load() into FP32 tensors would not convert them. The
// values are exactly the evaluated model's (bf16 and fp16 widen to FP32 without rounding).
std::shared_ptr<ClassifierImpl> fp32_copy(ClassifierImpl& model, const std::string& name, const ModelOptions& options) {
  auto copy = make_model(name, options);  // draws from the global RNG: only used once training is over
  torch::NoGradGuard no_grad;
  auto src = model.named_parameters(), dst = copy->named_parameters();
  for (auto& item : dst) item.value().copy_(src[item.key()]);
  auto src_buffers = model.named_buffers(), dst_buffers = copy->named_buffers();
  for (auto& item : dst_buffers) item.value().copy_(src_buffers[item.key()]);
  return copy;
}

std::string checkpoint_path(const TrainOptions& o) { return (fs::path(o.checkpoint_dir()) / "checkpoint.ampp").string(); }

Summary train(const TrainOptions& o) {
  validate(o);
  retain_freed_memory();  // no page faults on the same activation buffers every step (allocator.h)
  // ---- processes and threads ----
  dist::ProcessGroup pg;
  if (env_int("WORLD_SIZE", 1) > 1) pg = dist::is_initialized() ? dist::default_group() : dist::init_process_group();
  const int rank = pg ? pg.rank() : 0;
  const int world = pg ? pg.size() : 1;
  const int local_world = pg ? pg.local_size() : 1;
  int threads = o.threads();
  if (threads == 0) threads = env_int("OMP_NUM_THREADS", 0);
  if (threads == 0) threads = ampp::threads_per_worker(local_world);
  set_compute_threads(threads);  // LibTorch and OpenBLAS pools alike (threads.h)
  if (o.deterministic()) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  const bool leader = rank == 0;
  auto say = [&](const std::string& s) {
    if (leader && o.progress()) std::printf("%s\n", s.c_str()), std::fflush(stdout);
  };

  // ---- data, model, optimizer, amp, ddp ----
  const DatasetPair data = load_dataset(o.data(), o.seed());
  const int64_t per_rank_batch = o.batch_size() / world;  // seed 000: int(batch_size / ngpus_per_node)
  TORCH_CHECK(per_rank_batch >= 1, "--batch-size ", o.batch_size(), " is smaller than the number of workers (", world,
              "); use at least one image per worker");
  torch::manual_seed(o.seed());
  const auto& img = data.train.images;
  const auto model_options =
      ModelOptions().in_channels(img.size(1)).height(img.size(2)).width(img.size(3)).num_classes(data.train.num_classes);
  auto model = make_model(o.model(), model_options);
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(o.lr()).momentum(o.momentum()).weight_decay(o.weight_decay()));
  Properties props(o.opt_level());
  if (o.opt_level() != "O0") props.dtype(o.dtype());
  if (!o.loss_scale().empty()) props.loss_scale(LossScale(o.loss_scale()));
  props.verbosity(0);  // skipped steps are shown by the progress bar and metrics instead
  Amp amp = initialize(std::static_pointer_cast<torch::nn::Module>(model), opt, props);
  dist::DistributedSampler sampler(static_cast<size_t>(data.train.size()),
                                   dist::DistributedSamplerOptions().num_replicas(world).rank(rank).seed(o.seed()));
  std::optional<torch::optim::StepLR> scheduler;
  if (o.lr_step() > 0) scheduler.emplace(opt, static_cast<unsigned>(o.lr_step()), o.lr_gamma());

  // ---- resume ----
  int64_t start_epoch = 0, start_batch = 0, global_step = 0, skipped_total = 0;
  double elapsed_before = 0;
  EpochSums sums;
  const std::string ckpt = o.checkpoint_dir().empty() ? "" : checkpoint_path(o);
  const bool restarted = env_int("TORCHELASTIC_RESTART_COUNT", 0) > 0;  // `ampp run --max-restarts`
  bool resumed = false;
  if ((o.resume() || restarted) && !ckpt.empty()) {
    if (!fs::exists(ckpt)) {
      say(fmt::format("no checkpoint at {} yet: starting from scratch", ckpt));
    } else {
      torch::serialize::InputArchive in, m, op, a, s, t;
      load_checkpoint(in, ckpt);
      in.read("trainer", t);
      c10::IValue fp, ep, bp, gs, sk, el, acc;
      t.read("fingerprint", fp);
      TORCH_CHECK(fp.toStringRef() == fingerprint(o, world), "checkpoint '", ckpt, "' belongs to a different run (",
                  fp.toStringRef(), ") than this one (", fingerprint(o, world),
                  "); use the same flags to resume, or another --checkpoint-dir to start afresh");
      t.read("epoch", ep), t.read("batch", bp), t.read("global_step", gs), t.read("skipped_total", sk);
      t.read("elapsed", el), t.read("epoch_sums", acc);
      torch::Tensor rng;
      t.read("rng_cpu", rng);
      start_epoch = ep.toInt(), start_batch = bp.toInt(), global_step = gs.toInt(), skipped_total = sk.toInt();
      elapsed_before = el.toDouble();
      const auto acc_v = acc.toDoubleVector();
      if (leader) sums = {acc_v[0], acc_v[1], acc_v[2]};  // global totals live on rank 0 (see save)
      in.read("model", m);
      model->load(m);
      in.read("amp", a);
      AmpStateDict amp_state;
      for (const auto& key : a.keys()) {
        c10::IValue v;
        a.read(key, v);
        amp_state[key] = v;
      }
      amp.load_state_dict(amp_state);
      // StepLR keeps its count privately: replay the finished epochs, then the saved optimizer
      // state (which holds the same lr) overrides whatever the replay set.
      if (scheduler) for (int64_t e = 0; e < start_epoch; ++e) scheduler->step();
      in.read("optimizer", op);
      opt.load(op);
      in.read("sampler", s);
      sampler.load(s);
      set_rng_state(rng);
      resumed = true;
      say(fmt::format("resumed from {}: epoch {}, batch {}, step {}", ckpt, start_epoch + 1, start_batch, global_step));
    }
  }

  // DDP after the resume, so its construction broadcast starts every rank from the loaded weights.
  std::optional<Ddp> ddp;
  if (world > 1) ddp.emplace(model, pg);

  const auto run_start = Clock::now();
  auto elapsed = [&] { return elapsed_before + std::chrono::duration<double>(Clock::now() - run_start).count(); };
  auto save = [&](int64_t epoch, int64_t batch) {
    // Running sums become global totals held by rank 0, so any world size resumes them exactly.
    auto acc = torch::tensor({sums.loss_sum, sums.correct, sums.seen}, torch::kFloat64);
    allreduce_sum(pg, acc);
    sums = leader ? EpochSums{acc[0].item<double>(), acc[1].item<double>(), acc[2].item<double>()} : EpochSums{};
    if (!leader) return;
    torch::serialize::OutputArchive out, m, op, a, s, t;
    model->save(m);
    opt.save(op);
    for (const auto& [key, value] : amp.state_dict()) a.write(key, value);
    sampler.save(s);
    t.write("fingerprint", c10::IValue(fingerprint(o, world)));
    t.write("epoch", c10::IValue(epoch));
    t.write("batch", c10::IValue(batch));
    t.write("global_step", c10::IValue(global_step));
    t.write("skipped_total", c10::IValue(skipped_total));
    t.write("elapsed", c10::IValue(elapsed()));
    t.write("epoch_sums", c10::IValue(std::vector<double>{sums.loss_sum, sums.correct, sums.seen}));
    t.write("rng_cpu", get_rng_state(), /*is_buffer=*/true);
    out.write("model", m);
    out.write("optimizer", op);
    out.write("amp", a);
    out.write("sampler", s);
    out.write("trainer", t);
    save_checkpoint(out, ckpt);
  };

  // ---- outputs ----
  std::optional<MetricsWriter> metrics;
  if (leader) {
    fs::create_directories(o.out());
    metrics.emplace((fs::path(o.out()) / "metrics.jsonl").string(), /*append=*/resumed);
  }
  say(fmt::format("ampp train: {} on {}; {}; {} worker(s) x {} images/batch, {} thread(s) each", o.model(),
                  data.description, precision_label(o, amp), world, per_rank_batch, threads));

  // Testing aid: AMPP_TRAIN_TEST_KILL_AT_STEP=N makes the last rank SIGKILL itself after step N
  // of the first attempt, to test recovery under `ampp run --max-restarts`.
  const int64_t kill_at_step = (rank == world - 1 && !restarted) ? env_int("AMPP_TRAIN_TEST_KILL_AT_STEP", -1) : -1;

  // ---- the loop ----
  const bool tty = is_terminal(stdout);
  Evaluation last_eval;
  double last_train_loss = 0;
  int64_t epochs_done = start_epoch;
  bool stop = o.steps() > 0 && global_step >= o.steps();
  model->train();
  for (int64_t epoch = start_epoch; epoch < o.epochs() && !stop; ++epoch) {
    sampler.set_epoch(epoch);
    const auto idx = sampler.indices();
    BatchIterator batches(data.train, std::vector<int64_t>(idx.begin(), idx.end()), per_rank_batch, /*drop_last=*/true);
    TORCH_CHECK(batches.num_batches() > 0, "each worker has only ", idx.size(), " training images, fewer than its batch of ",
                per_rank_batch, "; lower --batch-size or use more data");
    if (epoch == start_epoch && start_batch > 0) batches.skip_to(start_batch);
    if (epoch != start_epoch || start_batch == 0) sums = {};
    std::optional<ProgressBar> bar;
    if (leader && o.progress()) bar.emplace(epoch, o.epochs(), batches.num_batches(), tty);
    const auto epoch_start = Clock::now();
    const int64_t epoch_first_step = global_step;
    auto interval_start = Clock::now();
    int64_t interval_steps = 0;
    double ips = 0;
    while (auto batch = batches.next()) {
      amp.zero_grad();  // same result as opt.zero_grad(), without the memset and add (handle.h)
      torch::Tensor logits = ddp ? amp.forward(*ddp, batch->data) : amp.forward(model, batch->data);
      logits = logits.to(torch::kFloat32);
      auto loss = torch::nn::functional::cross_entropy(logits, batch->target);
      amp.scale_loss(loss).backward();
      if (o.clip_grad_norm() > 0) torch::nn::utils::clip_grad_norm_(amp.master_params(), o.clip_grad_norm());
      const bool stepped = amp.step();
      ++global_step;
      ++interval_steps;
      if (!stepped) ++skipped_total;
      if (global_step == kill_at_step) std::raise(SIGKILL);  // fault injection for the recovery test
      const double loss_v = loss.item<double>();
      sums.loss_sum += loss_v * batch->target.size(0);
      sums.correct += logits.argmax(1).eq(batch->target).sum().item<double>();
      sums.seen += batch->target.size(0);
      const bool log_now = !stepped || global_step % o.log_every() == 0 || batches.position() == batches.num_batches();
      if (log_now || bar) {
        const double dt = std::chrono::duration<double>(Clock::now() - interval_start).count();
        if (dt > 0.2 || log_now || ips == 0) {
          ips = interval_steps * per_rank_batch * world / std::max(dt, 1e-9);
          interval_start = Clock::now();
          interval_steps = 0;
        }
      }
      if (leader && log_now) {
        StepRecord r;
        r.epoch = epoch, r.step = global_step, r.loss = loss_v, r.loss_scale = amp.loss_scale(), r.skipped = !stepped;
        r.skipped_total = skipped_total, r.lr = current_lr(opt), r.images_per_sec = ips, r.elapsed = elapsed();
        metrics->write(r);
      }
      if (bar) bar->update(batches.position(), ips, loss_v, amp.loss_scale(), skipped_total);
      stop = o.steps() > 0 && global_step >= o.steps();
      const bool epoch_end = batches.position() == batches.num_batches();
      if (!ckpt.empty() && !epoch_end && (stop || (o.checkpoint_every() > 0 && global_step % o.checkpoint_every() == 0))) {
        save(epoch, batches.position());
      }
      if (stop) break;
    }
    const bool finished_epoch = batches.position() == batches.num_batches();
    // Epoch totals over all ranks.
    auto acc = torch::tensor({sums.loss_sum, sums.correct, sums.seen}, torch::kFloat64);
    allreduce_sum(pg, acc);
    last_train_loss = acc[0].item<double>() / std::max(acc[2].item<double>(), 1.0);
    const double train_acc = 100.0 * acc[1].item<double>() / std::max(acc[2].item<double>(), 1.0);
    last_eval = evaluate(*model, amp, data.test, 512, pg, rank, world);
    if (!finished_epoch) break;  // stopped by --steps: the checkpoint above holds the position
    if (scheduler) scheduler->step();
    epochs_done = epoch + 1;
    const double epoch_seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    const int64_t epoch_steps = global_step - epoch_first_step;
    if (leader) {
      EpochRecord r;
      r.epoch = epoch, r.steps = global_step, r.train_loss = last_train_loss, r.train_accuracy = train_acc;
      r.test_loss = last_eval.loss, r.test_accuracy = last_eval.accuracy, r.seconds = epoch_seconds;
      r.images_per_sec = epoch_steps * per_rank_batch * world / std::max(epoch_seconds, 1e-9);
      r.skipped_total = skipped_total, r.loss_scale = amp.loss_scale(), r.lr = current_lr(opt);
      metrics->write(r);
      if (bar)
        bar->finish(fmt::format("epoch {}/{}: train loss {:.4f}, train acc {:.2f}%, test loss {:.4f}, test acc {:.2f}% ({:.1f} s)",
                                epoch + 1, o.epochs(), last_train_loss, train_acc, last_eval.loss, last_eval.accuracy,
                                epoch_seconds));
    }
    if (!ckpt.empty()) {
      sums = {};
      save(epoch + 1, 0);
    }
  }

  // ---- summary ----
  Summary s;
  s.model = o.model(), s.data = data.description, s.precision = precision_label(o, amp), s.world_size = world;
  s.compute = describe_compute_threads();
  s.epochs = epochs_done, s.steps = global_step, s.skipped_steps = skipped_total;
  s.test_accuracy = last_eval.accuracy, s.test_loss = last_eval.loss, s.train_loss = last_train_loss;
  s.seconds = elapsed();
  s.images_per_sec = s.seconds > 0 ? global_step * per_rank_batch * world / s.seconds : 0;
  s.final_scale = amp.loss_scale(), s.peak_rss_mb = peak_rss_mb();
  if (leader) {
    metrics->write_line(to_json(s));
    std::ofstream(fs::path(o.out()) / "summary.json") << to_json(s).dump(2) << "\n";
    torch::serialize::OutputArchive final_model;
    fp32_copy(*model, o.model(), model_options)->save(final_model);
    final_model.save_to((fs::path(o.out()) / "model.pt").string());
    if (o.progress()) std::printf("\n%s", summary_table(s).c_str());
    if (o.plots()) {
      try {
        const auto pngs = write_plots(metrics->path(), o.out());
        say(fmt::format("plots: {}", fmt::join(pngs, ", ")));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ampp train: warning: plots not written: %s\n", e.what());
      }
    }
    say(fmt::format("metrics: {}", metrics->path()));
  }
  if (pg) pg.barrier();
  return s;
}

}  // namespace ampp::train
