// ampp::train::train in named steps: set up the workers, build the run (data, model, optimizer,
// amp, sampler), resume, run the epochs (steps, evaluation, checkpoints), write the outputs.
#include <ampp/amp/initialize.h>
#include <ampp/amp/pytorch_checkpoint.h>
#include <ampp/dist/ddp.h>
#include <ampp/dist/fully_shard.h>
#include <ampp/dist/heartbeat.h>
#include <ampp/dist/hierarchical_allreduce.h>
#include <ampp/dist/process_group.h>
#include <ampp/dist/sampler.h>
#include <ampp/dist/sync_batch_norm.h>
#include <ampp/dist/zero_redundancy_optimizer.h>
#include <ampp/numerics/unscale.h>
#include <ampp/precision/dtype.h>
#include <ampp/precision/nonfinite_locator.h>
#include <ampp/scaling/cuda_graph_step.h>
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/train/allocator.h>
#include <ampp/train/batches.h>
#include <ampp/train/checkpoint.h>
#include <ampp/train/dataset.h>
#include <ampp/train/gpt.h>
#include <ampp/train/memory_report.h>
#include <ampp/train/models.h>
#include <ampp/train/op_profile.h>
#include <ampp/train/prefetcher.h>
#include <ampp/train/pytorch_training_checkpoint.h>
#include <ampp/train/step_phases.h>
#include <ampp/train/tensorboard.h>
#include <ampp/train/trainer.h>
#include <ampp/util/archive_bytes.h>
#include <ampp/util/atomic_file.h>
#include <ampp/util/folder_lock.h>
#include <ampp/util/launch_environment.h>
#include <ampp/util/parse_number.h>
#include <ampp/util/threads.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <unistd.h>

#include "buffer_guard.h"
#include "doctor.h"
#include "fault_injection.h"
#include "graphed_step.h"
#include "step_tally.h"
#include "report_json.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
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
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout() * 1000));
  const auto launch = launch_environment();
  if (launch.world_size_number() > 1)
    w.pg =
        dist::is_initialized() ? dist::default_group() : dist::init_process_group(dist::InitOptions().timeout(timeout));
  w.rank = w.pg ? w.pg.rank() : 0;
  w.world = w.pg ? w.pg.size() : 1;
  const int local_world = w.pg ? w.pg.local_size() : 1;
  w.threads = o.threads() > 0 ? o.threads() : static_cast<int>(env_int("OMP_NUM_THREADS", 0));
  if (w.threads <= 0) w.threads = threads_per_worker(local_world);
  set_compute_threads(w.threads);  // LibTorch and OpenBLAS pools alike (util/threads.h)
  if (o.deterministic()) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  w.restarted = launch.restart_count_number() > 0;
  return w;
}

// Runs `leader_work` on rank 0 only; every rank then learns whether it succeeded, so a failure
// there is an error on every rank instead of a hang in the next collective.
void on_leader_agreed(const Workers& w, const std::function<void()>& leader_work) {
  std::exception_ptr failure;
  if (w.leader()) {
    try {
      leader_work();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  auto failed = torch::tensor({failure ? 1.0 : 0.0}, torch::kFloat64);
  allreduce_sum(w.pg, failed);
  if (failure) std::rethrow_exception(failure);
  TORCH_CHECK(failed.item<double>() == 0, "rank 0 could not start the run (its error says why)");
}

// Before any work: the output folders are usable, and no other run writes into `out`.
std::unique_ptr<FolderLock> claim_outputs(const TrainOptions& o, const Workers& w) {
  std::unique_ptr<FolderLock> lock;
  on_leader_agreed(w, [&] {
    check_writable_folder(o.out(), "TrainOptions::out");
    if (!o.checkpoint_dir().empty()) check_writable_folder(o.checkpoint_dir(), "TrainOptions::checkpoint_dir");
    if (!o.tensorboard().empty()) check_writable_folder(o.tensorboard(), "TrainOptions::tensorboard");
    lock = std::make_unique<FolderLock>(o.out(), "TrainOptions::out");
  });
  return lock;
}

// The opt level's Properties with this run's dtype and loss scale.
Properties amp_properties(const TrainOptions& o) {
  Properties props(o.opt_level());
  if (o.opt_level() != OptLevel::O0) props.dtype(o.dtype());
  if (o.loss_scale()) props.loss_scale(*o.loss_scale());
  props.verbosity(0);  // skipped steps are shown by the progress bar and metrics instead
  return props;
}

ModelOptions model_options_for(const Dataset& train, const TrainOptions& o) {
  if (train.tokens) {
    return ModelOptions()
        .num_classes(train.num_classes)
        .context(train.images.size(1))
        .n_layer(o.n_layer())
        .n_head(o.n_head())
        .n_embd(o.n_embd());
  }
  const auto& img = train.images;
  return ModelOptions()
      .in_channels(img.size(1))
      .height(img.size(2))
      .width(img.size(3))
      .num_classes(train.num_classes)
      .sync_batch_norm(o.sync_batch_norm())
      .channels_last(o.channels_last());
}

std::shared_ptr<ClassifierImpl> seeded_model(const TrainOptions& o, const ModelOptions& model_options,
                                             const torch::Device& device) {
  torch::manual_seed(o.seed());
  auto model = make_model(o.model(), model_options);  // initialised on the CPU: the same weights everywhere
  model->to(device);
  return model;
}

// This worker's device: TrainOptions::device, where "cuda" without an index means one GPU per local rank
// (torchrun's LOCAL_RANK), cuda:(local rank % GPUs), so that more workers than GPUs share them. It becomes
// the process's current CUDA device, which the collectives on CUDA tensors use.
torch::Device worker_device(const TrainOptions& o, const Workers& w) {
  torch::Device device = device_of(o);
  if (!device.is_cuda()) return device;
  if (!device.has_index()) {
    const int gpus = std::max<int>(1, static_cast<int>(torch::cuda::device_count()));
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>((w.pg ? w.pg.local_rank() : 0) % gpus));
  }
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(device);
  return device;
}

torch::optim::SGDOptions sgd_options(const TrainOptions& o) {
  return torch::optim::SGDOptions(o.lr()).momentum(o.momentum()).weight_decay(o.weight_decay());
}

// TrainOptions::fsdp with several workers: the model sharded, its sharding_units() the units. Before the
// optimizer, which steps the shards; a resume then loads each rank's shards (load_into_shards).
// On a GPU the shards are CUDA tensors, which the run's Gloo group reduces through the host (ampp's shared
// memory reads host memory only).
std::unique_ptr<dist::FullyShardedDataParallel> make_fsdp(const TrainOptions& o,
                                                          const std::shared_ptr<ClassifierImpl>& model,
                                                          const dist::ProcessGroup& pg, const torch::Device& device) {
  if (!o.fsdp() || !pg) return nullptr;
  const bool shared_memory = o.shared_memory_allreduce() && device.is_cpu();  // --gloo-allreduce: off
  return std::make_unique<dist::FullyShardedDataParallel>(
      model, model->sharding_units(), dist::FullyShardOptions().process_group(pg).shared_memory(shared_memory));
}

// The model's forward, through FSDP when the model is sharded.
struct ShardedForward {
  dist::FullyShardedDataParallel* fsdp;
  torch::Tensor forward(const torch::Tensor& x) { return fsdp->forward<ClassifierImpl>(x); }
};

// SGD as the seeds use it; with TrainOptions::zero and several workers, its state sharded over them.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& params, const TrainOptions& o,
                                                        const dist::ProcessGroup& pg, const torch::Device& device) {
  // On a GPU, PyTorch's fused SGD kernel (TrainOptions::fused_optimizer): one launch for every parameter.
  if (device.is_cuda() && o.fused_optimizer() && !o.zero()) return std::make_unique<FusedSGD>(params, sgd_options(o));
  if (!o.zero() || !pg) return std::make_unique<torch::optim::SGD>(params, sgd_options(o));
  return std::make_unique<dist::ZeroRedundancyOptimizer>(
      std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(params)},
      dist::ZeroRedundancyOptimizer::factory_of<torch::optim::SGD>(sgd_options(o)),
      dist::ZeroRedundancyOptimizerOptions().process_group(pg));
}

// Cross-entropy over the last dimension of the logits: [N, classes] against [N], or a GPT's
// [N, T, vocabulary] against [N, T] (every position is a prediction of the next token).
torch::Tensor classification_loss(
    const torch::Tensor& logits, const torch::Tensor& target,
    torch::nn::functional::CrossEntropyFuncOptions::reduction_t reduction = torch::kMean) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}),
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(reduction));
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Images per second after warm-up, without evaluation or checkpoints: over the spans between two reads of
// the step tally within an epoch (each read waits for the device, so the time is the GPU's too), once
// kWarmSteps steps of this process have run (cuDNN's autotuning, first allocations and page faults).
struct SteadyRate {
  static constexpr int64_t kWarmSteps = 20;
  int64_t steps = 0;   // the steps measured
  double seconds = 0;  // and their time

  // A read after `steps_so_far` steps of this process.
  void mark(int64_t steps_so_far) {
    const auto now = Clock::now();
    if (since_ && steps_so_far >= kWarmSteps) {
      steps += steps_so_far - since_->first;
      seconds += std::chrono::duration<double>(now - since_->second).count();
    }
    if (steps_so_far >= kWarmSteps) since_ = {steps_so_far, now};
  }
  // The time since the last read is not step time (a checkpoint was written).
  void restart() {
    if (since_) since_->second = Clock::now();
  }
  void end_segment() { since_.reset(); }  // an evaluation follows

 private:
  std::optional<std::pair<int64_t, Clock::time_point>> since_;
};

// A dataset of at most this many bytes lives on the GPU, where each batch is gathered by index on the
// device: no host work, no copy and no loader thread per step (Fashion-MNIST: 55 MB; synthetic:32768:
// 103 MB). Larger ones stay on the host and are copied batch by batch.
constexpr int64_t kDataOnGpuBytes = int64_t{4} << 30;

int64_t bytes_of(const Dataset& d) { return d.images.nbytes() + d.labels.nbytes(); }

// On a GPU: the data on the device when it fits (the same values and order as on the host). Says where.
std::string place_data(DatasetPair& data, const torch::Device& device) {
  if (!device.is_cuda()) return "";
  const int64_t bytes = bytes_of(data.train) + bytes_of(data.test);
  if (bytes > kDataOnGpuBytes)
    return fmt::format("data: {} MB on the host, copied to the GPU batch by batch", bytes >> 20);
  for (Dataset* d : {&data.train, &data.test}) {
    d->images = d->images.to(device);
    d->labels = d->labels.to(device);
  }
  return fmt::format("data: on the GPU ({} MB), each batch gathered there", bytes >> 20);
}

// Everything one worker's run holds, built in the order the seeds build it.
struct Run {
  Run(const TrainOptions& options, Workers workers_in)
      : o(options),
        workers(std::move(workers_in)),
        device(worker_device(o, workers)),
        data(load_dataset(data_spec(o), o.seed(), o.num_classes(),
                          DataLoading().map_files(o.map_data()).context(context_of(o)))),
        per_rank_batch(o.batch_size() / workers.world),  // seed 000: int(batch_size / ngpus_per_node)
        model_options(model_options_for(data.train, o)),
        model(seeded_model(o, model_options, device)),
        fsdp(make_fsdp(o, model, workers.pg, device)),
        optimizer_holder(make_optimizer(fsdp ? fsdp->parameters() : model->parameters(), o, workers.pg, device)),
        optimizer(*optimizer_holder),
        amp(initialize(std::static_pointer_cast<torch::nn::Module>(model), optimizer, amp_properties(o))),
        buffer_guard(*model),  // after initialize(), which may cast the buffers
        sampler(static_cast<size_t>(data.train.size()),
                dist::DistributedSamplerOptions().num_replicas(workers.world).rank(workers.rank).seed(o.seed())),
        checkpoint(o.checkpoint_dir().empty() ? "" : checkpoint_path(o)) {
    TORCH_CHECK(per_rank_batch >= 1, "TrainOptions::batch_size ", o.batch_size(),
                " is smaller than the number of workers (", workers.world, "); use at least one image per worker");
    data_placement = place_data(data, device);
    if (fsdp) amp.set_found_inf_reducer(fsdp->found_inf_hook());  // each rank unscales only its shards
    if (device.is_cuda()) at::globalContext().setBenchmarkCuDNN(o.cudnn_benchmark() && !o.deterministic());
  }

  TrainingObjects objects() { return {*model, optimizer, amp, sampler}; }
  // The live loss scale (a host read).
  double loss_scale() const { return amp.loss_scale(); }
  dist::ZeroRedundancyOptimizer* zero() { return dynamic_cast<dist::ZeroRedundancyOptimizer*>(&optimizer); }
  // What a checkpoint holds: the whole state, under ZeRO gathered on the leader by consolidate_state_dict(),
  // under FSDP on every rank by GatheredForCheckpoint (the optimizer then steps shards, the values are the
  // module's).
  TrainingObjects objects_to_save() {
    auto* z = zero();
    auto& whole = fsdp_optimizer ? *fsdp_optimizer : z ? *z->consolidated() : optimizer;
    return {*model, whole, amp, sampler, fsdp_optimizer ? model->parameters() : gathered_masters};
  }
  double elapsed() const { return position.elapsed + std::chrono::duration<double>(Clock::now() - started).count(); }
  void say(const std::string& line) const {
    if (!workers.leader() || !o.progress()) return;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  const TrainOptions& o;
  Workers workers;
  torch::Device device;  // the model's and the batches' (TrainOptions::device); the data stays on the CPU
  DatasetPair data;
  int64_t per_rank_batch;
  ModelOptions model_options;
  std::shared_ptr<ClassifierImpl> model;
  std::unique_ptr<dist::FullyShardedDataParallel> fsdp;       // TrainOptions::fsdp with several workers, else null
  std::unique_ptr<torch::optim::Optimizer> optimizer_holder;  // SGD, or a ZeroRedundancyOptimizer around it
  torch::optim::Optimizer& optimizer;
  Amp amp;
  detail::BufferGuard buffer_guard;
  dist::DistributedSampler sampler;
  std::optional<Ddp> ddp;
  std::string communication;   // how DDP's workers reduce, said after the run's first line
  std::string data_placement;  // where the data lives, said there too
  std::string checkpoint;     // "" = no checkpoints
  RunPosition position;       // epoch/batch to start from; elapsed = seconds before this process
  EpochSums sums;             // the current epoch's running sums (this rank's; global totals on rank 0 after a save)
  bool resumed = false;
  std::optional<MetricsWriter> metrics;
  std::optional<TensorBoardWriter> tensorboard;  // rank 0, TrainOptions::tensorboard
  Clock::time_point started = Clock::now();      // reset when training starts (after resume and DDP)
  detail::FaultInjection faults;                 // test binaries only (fault_injection.h); none in ampp
  int64_t saves = 0;                             // checkpoints written by this process
  int64_t epochs_done = 0;
  double last_train_loss = 0;
  Evaluation last_eval;
  // For the divergence message: the last finite loss and where it was.
  double last_finite_loss = std::numeric_limits<double>::quiet_NaN();
  int64_t last_finite_loss_step = 0;
  std::vector<std::string> last_overflowed;  // the parameters of the latest skipped step
  std::optional<GradientRanges> ranges;      // the numerics doctor's report (TrainOptions::doctor, rank 0)
  nlohmann::json first_non_finite;           // the doctor's replay of the first skipped step (null: none yet)
  StepPhases phases;                         // where this process's step time went
  PhaseClock clock{phases};
  std::optional<OpRecorder> op_recorder;  // TrainOptions::profile, rank 0: LibTorch's profiler over a window
  std::optional<OpProfile> ops;
  std::vector<torch::Tensor> gathered_masters;        // ZeRO under O2: every shard's masters, for the checkpoint
  std::unique_ptr<torch::optim::SGD> fsdp_optimizer;  // FSDP: the unsharded SGD, while a checkpoint is written
  std::unique_ptr<detail::GraphedTrainStep> graphed;  // TrainOptions::cuda_graphs, else null
  detail::StepTally tally{o.max_consecutive_skips()};  // the steps' results on the device, until a read
  // Read the tally after every step: on the CPU, where a read costs nothing and each skipped step gets its
  // own record with the names of its inf/NaN gradients, and under the doctor, which inspects every step.
  // Set once the faults are known (train()): the CPU tests of the graphed path read as a GPU run does.
  bool reads_every_step = true;
  std::vector<std::string> step_overflowed;  // where reads_every_step: the last step's inf/NaN gradients
  SteadyRate steady;                         // images/s after warm-up, evaluation and checkpoints excluded
};

// ---- small helpers ----

// The run's identity in its checkpoint. The loss scale is part of it (a different one on resume would
// be silently replaced by the checkpoint's); checkpoints written before it was added omit it.
std::string fingerprint(const TrainOptions& o, int world, bool with_loss_scale = true) {
  std::string f = fmt::format("model={} data={} opt_level={} dtype={} batch_size={} world_size={} seed={}", o.model(),
                              dataset_name(data_spec(o)), to_string(o.opt_level()), c10::toString(o.dtype()),
                              o.batch_size(), world, o.seed());
  if (is_gpt(o.model()))
    f += fmt::format(" context={} n_layer={} n_head={} n_embd={}", context_of(o), o.n_layer(), o.n_head(), o.n_embd());
  if (with_loss_scale) f += " loss_scale=" + amp_properties(o).loss_scale().to_string();
  if (o.warmup_steps() > 0) f += fmt::format(" warmup_steps={}", o.warmup_steps());  // absent before warmup
  return f;
}

bool same_run(const std::string& saved, const TrainOptions& o, int world) {
  const bool has_loss_scale = saved.find(" loss_scale=") != std::string::npos;
  return saved == fingerprint(o, world, has_loss_scale);
}

std::string precision_label(const TrainOptions& o, const Amp& amp) {
  if (o.opt_level() == OptLevel::O0) return "O0 (fp32)";
  return fmt::format("{} {}{}, loss scale {}", to_string(o.opt_level()), low_precision_dtype_name(o.dtype()),
                     amp.fp16_emulated() ? " (emulated on CPU)" : "", amp.properties().loss_scale().to_string());
}

double current_lr(torch::optim::Optimizer& opt) {
  return static_cast<torch::optim::SGDOptions&>(opt.param_groups().front().options()).lr();
}

// The learning rate of a step in `epoch` after `steps_taken` optimizer steps (skipped ones excluded).
// A function of the two counts, both in the checkpoint, so a resumed run gets the same schedule bit
// for bit. The decay is LibTorch's StepLR stepped once per epoch (lr * gamma, multiplied in turn; its
// first decay applies to epoch lr_step + 1, one epoch later than PyTorch's StepLR); warmup scales it.
double scheduled_lr(const TrainOptions& o, int64_t epoch, int64_t steps_taken) {
  double lr = o.lr();
  for (int64_t e = 1; o.lr_step() > 0 && e < epoch; ++e)
    if (e % o.lr_step() == 0) lr = o.lr_gamma() * lr;
  if (steps_taken < o.warmup_steps())
    lr *= static_cast<double>(steps_taken + 1) / static_cast<double>(o.warmup_steps());
  return lr;
}

int64_t steps_taken(const RunPosition& p) { return p.global_step - p.skipped_total; }

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

// The checkpoint's SGD hyperparameters (which loading put in force, as PyTorch's load_state_dict
// does) must be this run's: a silent change of momentum would be a different run. `source` names it.
void check_sgd_options(const Run& run, const std::string& source) {
  const auto& sgd = static_cast<const torch::optim::SGDOptions&>(run.optimizer.param_groups().front().options());
  TORCH_CHECK(sgd.momentum() == run.o.momentum() && sgd.weight_decay() == run.o.weight_decay(), source,
              " was trained with SGD momentum ", sgd.momentum(), " and weight decay ", sgd.weight_decay(),
              "; this run has momentum ", run.o.momentum(), " and weight decay ", run.o.weight_decay(),
              ": pass --momentum ", sgd.momentum(), " --weight-decay ", sgd.weight_decay());
  TORCH_CHECK(sgd.dampening() == 0 && !sgd.nesterov(), source, " was trained with SGD dampening ", sgd.dampening(),
              (sgd.nesterov() ? " and Nesterov momentum" : ""), ", which ampp train's SGD does not use");
}

// FSDP: a checkpoint holds the unsharded model and SGD state (this run's, DDP's, or another world size's).
// `load` reads it into an unsharded copy, of which each rank then keeps its rows.
void load_into_shards(Run& run, const std::function<void(const TrainingObjects&)>& load) {
  const torch::Tensor rng = get_rng_state();  // building the copy draws initial weights: the run's stream stays
  const auto whole = make_model(run.o.model(), run.model_options);
  set_rng_state(rng);
  torch::optim::SGD sgd(whole->parameters(), sgd_options(run.o));
  load(TrainingObjects{*whole, sgd, run.amp, run.sampler});
  run.fsdp->load_full_state_dict(module_state_dict(*whole));
  run.fsdp->load_full_optimizer_state_dict(run.optimizer, optimizer_state_dict(sgd));
}

// Continues from the checkpoint when asked to (or restarted by the launcher) and one exists.
void resume(Run& run) {
  if (run.checkpoint.empty() || !(run.o.resume() || run.workers.restarted)) return;
  if (!fs::exists(run.checkpoint)) {
    run.say(fmt::format("no checkpoint at {} yet: starting from scratch", run.checkpoint));
    return;
  }
  TrainingCheckpoint saved(run.checkpoint);
  const std::string expected = fingerprint(run.o, run.workers.world);
  TORCH_CHECK(same_run(saved.position().fingerprint, run.o, run.workers.world), "checkpoint '", run.checkpoint,
              "' belongs to a different run (", saved.position().fingerprint, ") than this one (", expected,
              "); use the same options to resume, or another TrainOptions::checkpoint_dir to start afresh");
  if (run.fsdp)
    load_into_shards(run, [&](const TrainingObjects& whole) { saved.restore(whole); });
  else
    saved.restore(run.objects());  // the lr follows from the position (scheduled_lr)
  check_sgd_options(run, "checkpoint '" + run.checkpoint + "'");
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
  // Under ZeRO and FSDP the file's state goes into an unsharded SGD first; each rank then keeps its shard's.
  PyTorchCheckpointContents c;
  auto* zero = run.zero();
  std::unique_ptr<torch::optim::SGD> unsharded;
  if (zero) unsharded = std::make_unique<torch::optim::SGD>(run.optimizer.param_groups(), sgd_options(run.o));
  if (run.fsdp)
    load_into_shards(run, [&](const TrainingObjects& whole) { c = load_pytorch_training_checkpoint(path, whole); });
  else
    c = load_pytorch_training_checkpoint(path, {*run.model, zero ? *unsharded : run.optimizer, run.amp, run.sampler});
  if (zero) zero->load_from(*unsharded);
  if (c.optimizer) check_sgd_options(run, "PyTorch checkpoint '" + path + "'");
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

// Testing aid: what a kill in the middle of a checkpoint write leaves (half a temporary file).
[[noreturn]] void die_halfway_through_save(Run& run, const RunPosition& now) {
  const std::string bytes = training_checkpoint_bytes(run.objects_to_save(), now);
  std::fprintf(stderr, "ampp train: test fault: rank %d killed halfway through the checkpoint of step %lld\n",
               run.workers.rank, static_cast<long long>(now.global_step));
  std::ofstream(temporary_path_for(run.checkpoint), std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  std::raise(SIGKILL);
  std::abort();  // not reached
}

bool check_finite_weights(Run& run);  // below, with the divergence checks

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

// FSDP, while a checkpoint is written: the whole model back in the module and an SGD over it holding every
// shard's momentum, so that the file is the unsharded run's (DDP and any world size resume it). Collective.
class GatheredForCheckpoint {
 public:
  explicit GatheredForCheckpoint(Run& run) : run_(run) {
    if (!run_.fsdp) return;
    run_.fsdp->unshard();
    run_.fsdp_optimizer = std::make_unique<torch::optim::SGD>(run_.model->parameters(), sgd_options(run_.o));
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

// Running sums become global totals held by rank 0, so any world size resumes them exactly.
void save(Run& run, int64_t epoch, int64_t batch) {
  const GatheredForCheckpoint gathered(run);  // before the check, which reads the whole weights
  if (!check_finite_weights(run)) return;  // a diagnosis run goes on; the last checkpoint stays
  const EpochSums totals = global_totals(run.workers.pg, run.sums);
  run.sums = run.workers.leader() ? totals : EpochSums{};
  if (auto* zero = run.zero()) zero->consolidate_state_dict(0);  // every rank sends its shard to the leader
  run.gathered_masters = gather_masters(run);
  if (!run.workers.leader()) return;
  RunPosition now;
  now.fingerprint = fingerprint(run.o, run.workers.world);
  now.epoch = epoch;
  now.batch = batch;
  now.global_step = run.position.global_step;
  now.skipped_total = run.position.skipped_total;
  now.elapsed = run.elapsed();
  now.epoch_sums = run.sums;
  now.last_train_loss = run.last_train_loss;
  if (++run.saves == run.faults.kill_in_save.value_or(-1)) die_halfway_through_save(run, now);
  save_training_checkpoint(run.checkpoint, run.objects_to_save(), now);
  save_pytorch_training_checkpoint(pytorch_checkpoint_path(run.o), run.objects_to_save(), now);
  dist::report_progress(run.position.global_step);
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
  // Summed where the model is, read once at the end: a read per batch would wait for the GPU each time.
  auto loss_sum = torch::zeros({}, torch::dtype(torch::kDouble).device(run.device));
  auto correct = torch::zeros({}, torch::dtype(torch::kLong).device(run.device));
  for (int64_t i = begin; i < end; i += batch) {
    dist::report_progress(run.position.global_step);  // alive, for the launcher's stall watch
    const int64_t j = std::min(end, i + batch);
    auto x = test.rows(i, j).to(run.device);
    auto y = test.labels.slice(0, i, j).to(run.device);
    torch::Tensor logits;
    {
      auto region = run.amp.autocast();
      auto input = run.amp.cast_input(x);
      logits = run.fsdp ? run.fsdp->forward<ClassifierImpl>(input) : run.model->forward(input);
      logits = run.amp.cast_output(logits).to(torch::kFloat32);
    }
    loss_sum += classification_loss(logits, y, torch::kSum).to(torch::kDouble);
    correct += detail::correct_prediction_count(logits, y);
  }
  auto sums = torch::stack({loss_sum, correct.to(torch::kDouble)}).cpu();
  allreduce_sum(run.workers.pg, sums);
  run.model->train();
  const auto targets = static_cast<double>(test.labels.numel());  // images, or tokens
  return {sums[0].item<double>() / targets, 100.0 * sums[1].item<double>() / targets};
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

// How the epoch's batches reach the step: on a GPU prepared one ahead by a loader thread (TrainOptions::
// prefetch_batches) and copied on a side stream, from pinned memory (TrainOptions::pinned_batches). On the
// CPU a batch is one gather, about 1% of a step (docs/gpu.md), and a loader thread there would compete with
// the step's threads for the cores, so the test faults alone turn it on there.
PrefetchOptions batch_loading(const Run& run) {
  const bool on_host = run.data.train.images.device().is_cpu();  // on the GPU, a batch is one gather there
  const bool loader_thread =
      run.o.prefetch_batches() && on_host && (run.device.is_cuda() || run.faults.prefetch_on_cpu);
  return PrefetchOptions(run.device).pinned(run.o.pinned_batches()).background(loader_thread);
}

// The host's view of the steps up to a read: the last step's loss, whether it stepped, and where a
// skipped step's gradients were inf/NaN (known only where the trainer reads every step).
struct StepResult {
  double loss = 0;
  bool stepped = false;                 // false: skipped after an overflow
  std::vector<std::string> overflowed;  // skipped: the parameters whose gradients were inf/NaN
};

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

std::vector<torch::Tensor> gradients_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

// The gradients the optimizer steps (O2: the masters'), by the model's parameter names.
std::vector<std::pair<std::string, torch::Tensor>> named_master_gradients(const Run& run) {
  auto named = named_master_params(*run.model, run.amp);
  for (auto& [name, master] : named) master = master.grad();
  return named;
}

// Testing aid: an inf loss on this rank at the steps AMPP_TRAIN_TEST_INF_AT names.
torch::Tensor maybe_inject_inf(const Run& run, const torch::Tensor& loss) {
  const int64_t step = run.position.global_step + 1;
  if (run.faults.inf_steps.count(step) == 0) return loss;
  std::fprintf(stderr, "ampp train: test fault: rank %d: inf loss injected at step %lld\n", run.workers.rank,
               static_cast<long long>(step));
  return loss * std::numeric_limits<float>::infinity();
}

// The doctor, at the first skipped step: rank 0 runs its batch's forward and scaled backward again
// under a NonFiniteLocator to find the op (and module) where the first inf/NaN was born. The step was
// skipped, so the weights are the ones it saw; the model is called directly (not through DDP, whose
// hooks stay disarmed: no collective), BatchNorm's statistics are put back and the gradients dropped.
// SyncBatchNorm uses rank 0's own batch statistics here: the other ranks do not take part.
void locate_first_non_finite(Run& run, const Batch& batch, double scale) {
  run.buffer_guard.save();
  std::optional<NonFiniteOrigin> origin;
  {
    dist::LocalBatchNormGuard no_collectives;
    NonFiniteLocator locate(*run.model);
    auto logits = run.amp.forward(run.model, batch.data).to(torch::kFloat32);
    (classification_loss(logits, batch.target) * scale).backward();
    origin = locate.first();
  }
  run.buffer_guard.restore();
  run.amp.zero_grad();
  run.first_non_finite = {{"step", run.position.global_step + 1}, {"rank", run.workers.rank}};
  run.first_non_finite["origin"] = origin ? nlohmann::json(origin->describe()) : nlohmann::json(nullptr);
  run.first_non_finite["module"] = origin ? origin->module : "";
  if (!origin)
    run.first_non_finite["note"] =
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

// torch::nn::utils::clip_grad_norm_'s operations (the same values), without its return value's host read.
void clip_grad_norm_on_device(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  const auto grads = gradients_of(params);
  if (grads.empty()) return;
  std::vector<torch::Tensor> norms;
  for (const auto& g : grads) norms.push_back(g.norm(2.0));
  const auto total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
  const auto coef = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (auto g : grads) g.mul_(coef);
}

void clip_gradients(Run& run) {
  if (run.o.clip_grad_norm() <= 0) return;
  if (run.fsdp)
    run.fsdp->clip_grad_norm_(run.o.clip_grad_norm());  // the global norm over every rank's shards
  else
    clip_grad_norm_on_device(run.amp.master_params(), run.o.clip_grad_norm());
}

// The optimizer's step, skipped where the gradients are not finite; returns the skip flag, on the device.
// Amp decides with its loss scaler; without one, `non_finite` (above) does. A fused optimizer skips by
// itself on the device; another one needs the flag on the host.
torch::Tensor step_optimizer(Run& run, const torch::Tensor& non_finite) {
  if (!non_finite.defined()) {
    run.amp.step();
    return run.amp.last_step_skipped();
  }
  if (auto* fused = dynamic_cast<GradScaleAwareOptimizer*>(&run.optimizer)) {
    fused->set_grad_scaling(torch::Tensor(), non_finite);
    run.amp.step();
  } else if (non_finite.item<float>() == 0.0F) {
    run.amp.step();
  }
  return non_finite;
}

// The last backward's wait for its buckets' allreduce, after autograd finished (reducer.h).
double allreduce_wait_seconds(Ddp& ddp) {
  const dist::IterationTimeline t = ddp.reducer().last_timeline();
  return std::chrono::duration<double>(t.finalize_end - t.finalize_begin).count();
}

// Where a step's inf/NaN gradients are, read before the step (which drops a skipped step's gradients, as
// apex), on a trainer that reads every step: host reads, free on the CPU.
std::vector<std::string> overflowed_before_step(Run& run, const torch::Tensor& non_finite) {
  if (!run.reads_every_step) return {};
  const bool skips = non_finite.defined() ? non_finite.item<float>() != 0.0F : run.amp.step_will_skip();
  return skips ? non_finite_gradient_names(named_gradient_holders(run)) : std::vector<std::string>{};
}

// One training step, queued with nothing read on the host (a CUDA graph captures it), but for what a
// trainer that reads every step asks (overflowed_before_step) and the doctor's inspection.
detail::StepTally::Step train_step(Run& run, const torch::Tensor& data, const torch::Tensor& target) {
  Amp& amp = run.amp;
  amp.zero_grad();  // same result as opt.zero_grad(), without the memset and add (amp/amp.h)
  run.buffer_guard.save();
  ShardedForward sharded{run.fsdp.get()};
  torch::Tensor logits = run.ddp    ? amp.forward(*run.ddp, data)
                         : run.fsdp ? amp.forward(sharded, data)
                                    : amp.forward(run.model, data);
  logits = logits.to(torch::kFloat32);
  auto loss = classification_loss(logits, target);
  auto scaled = amp.scale_loss(maybe_inject_inf(run, loss));
  run.clock.lap(StepPhase::kForward);
  scaled.backward();
  run.clock.lap(StepPhase::kBackward);
  if (run.ddp) run.clock.move(StepPhase::kBackward, StepPhase::kAllreduceWait, allreduce_wait_seconds(*run.ddp));
  if (run.ranges) run.ranges->observe(named_master_gradients(run), scaled.scale(), loss.item<double>());
  const torch::Tensor non_finite = amp.checks_overflow() ? torch::Tensor() : unscaled_gradients_non_finite(run);
  run.step_overflowed = overflowed_before_step(run, non_finite);
  clip_gradients(run);  // a skipped step's clipped gradients are never used
  const torch::Tensor skipped = step_optimizer(run, non_finite);
  run.buffer_guard.restore_where_non_finite();  // also after a taken step: x*x can overflow while x did not
  if (run.ranges && run.first_non_finite.is_null() && skipped.defined() && skipped.item<float>() != 0.0F)
    locate_first_non_finite(run, Batch{data, target}, scaled.scale());
  run.clock.lap(StepPhase::kOptimizer);
  return {logits.detach(), loss.detach(), skipped};
}

// The step, eager or replayed from a CUDA graph (TrainOptions::cuda_graphs), added to the run's tally.
// The lr warm-up changes the lr every step, which a graph would have to capture anew each time: its steps
// run eagerly, and the graph is captured after it.
void run_step(Run& run, const Batch& batch, double lr) {
  detail::set_lr(run.optimizer, lr);
  std::optional<ErrorOnCudaSync> no_sync;  // a GPU test's proof that the step reads nothing on the host
  if (run.faults.error_on_sync) no_sync.emplace();
  if (run.graphed && steps_taken(run.position) >= run.o.warmup_steps()) {
    run.graphed->step(batch.data, batch.target, lr);
    run.tally.count(batch.target.numel());  // a replay does no host work of its own
  } else {
    run.tally.add(train_step(run, batch.data, batch.target), batch.target);
  }
}

void count_step(Run& run) {
  ++run.position.global_step;
  if (run.faults.kill_at_step == run.position.global_step) std::raise(SIGKILL);
  if (run.faults.stop_at_step == run.position.global_step) std::raise(SIGSTOP);
}

void log_step(Run& run, int64_t epoch, const StepResult& step, double images_per_sec) {
  StepRecord r;
  r.epoch = epoch;
  r.step = run.position.global_step;
  r.loss = step.loss;
  r.loss_scale = run.loss_scale();
  r.skipped = !step.stepped;
  r.overflowed = step.overflowed;
  r.skipped_total = run.position.skipped_total;
  r.lr = current_lr(run.optimizer);
  r.images_per_sec = images_per_sec;
  r.elapsed = run.elapsed();
  run.metrics->write(r);
  if (run.tensorboard) {
    log_to_tensorboard(*run.tensorboard, r);
    if (run.ranges) log_to_tensorboard(*run.tensorboard, *run.ranges, r.step);
  }
}

// "the last of them had inf/NaN gradients in fc1.weight, fc1.bias and 4 more".
std::string where_it_overflowed(const std::vector<std::string>& names) {
  if (names.empty()) return "no parameter gradient of the last one was non-finite on this rank";
  const size_t shown = std::min<size_t>(names.size(), 3);
  std::string list =
      fmt::format("{}", fmt::join(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown), ", "));
  if (names.size() > shown) list += fmt::format(" and {} more", names.size() - shown);
  return "the last of them had inf/NaN gradients in " + list;
}

// What to try, from what the run was doing when its gradients stayed non-finite.
std::string divergence_hint(const Run& run) {
  const LossScale& scale = run.amp.properties().loss_scale();
  const std::string lr = fmt::format("TrainOptions::lr ({:g})", run.o.lr());
  if (run.amp.checks_overflow() && !scale.is_dynamic() && scale.value() > 1)
    return fmt::format(
        "the static loss scale {:g} may overflow the {} gradients: use TrainOptions::loss_scale "
        "dynamic or a smaller value; or lower {}",
        scale.value(), low_precision_dtype_name(run.o.dtype()), lr);
  if (run.amp.checks_overflow() && scale.is_dynamic())
    return fmt::format(
        "the dynamic loss scale backed off to {:g}, so this is not a loss-scale overflow; lower {} "
        "(or check the data){}",
        run.amp.loss_scale(), lr,
        run.o.dtype() == c10::kHalf ? ", or try TrainOptions::dtype bf16 (fp32's range)" : "");
  return "lower " + lr + " (or check the data)";
}

// Rank 0 under TrainOptions::doctor: doctor.json, the picture, and the recommendation on the terminal.
void write_doctor_outputs(const Run& run) {
  if (!run.ranges) return;
  for (const auto& line : doctor_summary(*run.ranges)) run.say(line);
  if (run.first_non_finite.contains("origin") && !run.first_non_finite["origin"].is_null())
    run.say(fmt::format("doctor: step {}: {}", run.first_non_finite["step"].get<int64_t>(),
                        run.first_non_finite["origin"].get<std::string>()));
  try {
    const auto written = write_doctor_report(*run.ranges, run.first_non_finite, run.o.out(), run.o.plots());
    run.say(fmt::format("doctor: {}", fmt::join(written, ", ")));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampp train: warning: the doctor's report was not written: %s\n", e.what());
  }
}

// Ends the run with an error: a diverged run must not end "successfully" with a useless model. Every
// rank reaches the same decision at the same step (global overflow flag, averaged gradients, the
// same weights), so every rank stops alike.
[[noreturn]] void stop_diverged(Run& run, const std::string& what) {
  const std::string loss =
      std::isnan(run.last_finite_loss)
          ? std::string("no step of this process had a finite loss")
          : fmt::format("the last finite loss was {:.6g} at step {}", run.last_finite_loss, run.last_finite_loss_step);
  const std::string message = fmt::format("the run diverged: {}; {}; {}. Likely fix: {}. model.pt was not written",
                                          what, loss, where_it_overflowed(run.last_overflowed), divergence_hint(run));
  if (run.metrics)
    run.metrics->write_line(
        {{"type", "error"}, {"cause", "diverged"}, {"step", run.position.global_step}, {"message", message}});
  write_doctor_outputs(run);  // a diverged run is what the doctor is for
  TORCH_CHECK(false, message);
}

// Divergence by skipped steps (TrainOptions::max_consecutive_skips = L, 0: never): L in a row, or more
// than L of the last 2L, so that one finite step now and then does not hide a run that is skipping
// most of its steps. Shorter runs are caught by their non-finite weights or final loss
// (check_finite_weights, check_final_loss). The rule a step `last` broke with `in_a_row` skips in a row and
// `recent_skipped` of the last `recent_steps`, said; "" when it broke none.
std::string broken_skip_rule(int64_t limit, int64_t in_a_row, int64_t recent_skipped, int64_t recent_steps,
                             int64_t last) {
  if (limit > 0 && in_a_row >= limit)
    return fmt::format(
        "steps {} to {} ({} in a row, TrainOptions::max_consecutive_skips) had inf/NaN "
        "gradients and were skipped (no step was taken on them)",
        last - in_a_row + 1, last, in_a_row);
  if (limit > 0 && recent_skipped > limit)
    return fmt::format(
        "{} of the last {} steps (to step {}) had inf/NaN gradients and were skipped, more "
        "than TrainOptions::max_consecutive_skips ({}) in twice that many steps",
        recent_skipped, recent_steps, last, limit);
  return "";
}

// The steps since the last read into the epoch's sums and the position, and the last step as the host
// sees it. A host synchronisation.
StepResult read_steps(Run& run, const detail::StepTally::Readout& r) {
  run.sums.loss_sum += r.loss_sum;
  run.sums.correct += r.correct;
  run.sums.seen += r.seen;
  run.position.skipped_total += r.skipped;
  StepResult step;
  step.loss = r.last_loss;
  step.stepped = r.consecutive_skips == 0;
  if (!step.stepped) step.overflowed = run.step_overflowed;
  return step;
}

// The device watched the rules step by step (SkipWatch): a read tells the first step that broke one, also
// where a finite step followed before the read, and every rank stops at the same read.
void check_divergence(Run& run, const StepResult& step, const detail::StepTally::Readout& r) {
  if (std::isfinite(step.loss)) {
    run.last_finite_loss = step.loss;
    run.last_finite_loss_step = run.position.global_step;
  }
  if (!step.stepped) run.last_overflowed = step.overflowed;
  if (!r.first_break) return;
  const int64_t limit = run.o.max_consecutive_skips();
  const auto& broke = *r.first_break;
  const int64_t step_of_break = run.position.global_step - (r.steps - broke.step);
  stop_diverged(run, broken_skip_rule(limit, broke.in_a_row, broke.recent_skips, std::min(broke.step, 2 * limit),
                                      step_of_break));
}

// `ampp doctor` (doctor on, no divergence stop): a diagnosis runs every step and reports instead of
// failing; it still never saves non-finite weights.
bool diagnosis_only(const TrainOptions& o) { return o.doctor() && o.max_consecutive_skips() == 0; }

// The weights (and O2's masters) must be finite before they are saved anywhere: a step taken on
// finite gradients can still overflow them (fp16 at O3, a huge learning rate). The checkpoint already
// on disk then keeps the last finite weights. false: not finite, in a diagnosis run.
bool check_finite_weights(Run& run) {
  std::vector<torch::Tensor> weights = run.amp.master_params();
  for (const auto& p : run.model->parameters()) weights.push_back(p);
  for (const auto& b : run.model->buffers())
    if (b.is_floating_point()) weights.push_back(b);
  if (!numerics::has_non_finite(weights)) return true;
  if (diagnosis_only(run.o)) return false;
  std::vector<std::string> names;
  for (const auto& item : run.model->named_parameters())
    if (!torch::isfinite(item.value()).all().item<bool>()) names.push_back(item.key());
  run.last_overflowed = names;
  stop_diverged(run, fmt::format("after step {} the weights hold inf/NaN values{}", run.position.global_step,
                                 run.checkpoint.empty() ? "" : " (the last checkpoint keeps the last finite ones)"));
}

bool check_final_loss(Run& run) {
  if (std::isfinite(run.last_eval.loss)) return true;
  if (diagnosis_only(run.o)) return false;
  stop_diverged(
      run, fmt::format("after step {} the test loss is not finite ({})", run.position.global_step, run.last_eval.loss));
}

// Whether the step just taken ends with a checkpoint before its epoch's end (which end_epoch() writes):
// every checkpoint_every steps, and where the step limit stops the run.
bool saves_mid_epoch(const Run& run, bool epoch_end, bool stop) {
  const int64_t every = run.o.checkpoint_every();
  const bool periodic = every > 0 && run.position.global_step % every == 0;
  return !run.checkpoint.empty() && !epoch_end && (stop || periodic);
}

// Under TrainOptions::profile, rank 0 records the operators of steps kOpWindowFirst+1 to
// kOpWindowFirst+kOpWindowSteps (after the first steps' one-off costs: oneDNN primitive creation, first
// page faults), or up to the end of that epoch (no evaluation in the window). Only a window: the
// profiler costs microseconds per operator.
constexpr int64_t kOpWindowFirst = 3, kOpWindowSteps = 20;

void record_operators(Run& run, bool epoch_ended) {
  if (!run.op_recorder) return;
  const int64_t recorded = run.phases.steps - kOpWindowFirst;
  if (run.op_recorder->recording() && (recorded == kOpWindowSteps || epoch_ended)) {
    run.ops = run.op_recorder->stop(recorded);
  } else if (!run.ops && !run.op_recorder->recording() && !epoch_ended && recorded == 0) {
    run.op_recorder->start();
  }
}

// Whether the host reads the steps' results after this one: where a read costs nothing (the CPU) or the
// doctor inspects every step (Run::reads_every_step), and while the lr warms up, since its schedule counts
// the steps taken (skips excluded). On a GPU otherwise only at log points: a read waits for the GPU.
bool reads_after_step(const Run& run) {
  return run.reads_every_step || steps_taken(run.position) < run.o.warmup_steps();
}

// The epoch's steps, until its end or TrainOptions::steps; checkpoints every checkpoint_every steps
// and where the step limit stops it mid-epoch. The host reads the device's tally (StepTally) only every
// log_every steps, at the epoch's end, at the step limit and before a checkpoint (or every step where
// reads_after_step says).
void train_batches(Run& run, int64_t epoch, BatchPrefetcher& batches, ProgressBar* bar) {
  const auto& o = run.o;
  const int64_t images_per_step = run.per_rank_batch * run.workers.world;
  Throughput meter;
  run.clock.restart();  // between epochs: evaluation and checkpoints are not step time
  while (const auto next = batches.next()) {
    record_operators(run, false);
    run.clock.lap(StepPhase::kData);
    const bool reads = reads_after_step(run);  // the position before the step decides
    run_step(run, *next, scheduled_lr(o, epoch, steps_taken(run.position)));
    count_step(run);
    dist::report_progress(run.position.global_step);
    ++meter.steps;
    const bool epoch_end = batches.position() == batches.num_batches(), stop = reached_step_limit(run);
    const bool saves = saves_mid_epoch(run, epoch_end, stop);
    const bool logged = run.position.global_step % o.log_every() == 0 || epoch_end;
    if (reads || logged || stop || saves) {
      const auto readout = run.tally.read();
      run.steady.mark(readout.steps);
      const StepResult step = read_steps(run, readout);
      const bool log_now = logged || !step.stepped;
      if (log_now || bar) meter.update(log_now, images_per_step);
      if (log_now && run.metrics) log_step(run, epoch, step, meter.images_per_sec);
      if (bar)
        bar->update(batches.position(), meter.images_per_sec, step.loss, run.loss_scale(), run.position.skipped_total);
      check_divergence(run, step, readout);
    }
    if (saves) {
      save(run, epoch, batches.position());  // after a read: the sums and the scale are the step's
      run.steady.restart();                  // a checkpoint is not step time
    }
    ++run.phases.steps;
    run.clock.lap(StepPhase::kBookkeeping);
    if (stop) break;
  }
  run.steady.end_segment();
  record_operators(run, true);
}

struct EpochStart {
  Clock::time_point time = Clock::now();
  int64_t global_step = 0;
};

// A finished epoch: the next epoch's lr, the epoch record and progress line, the epoch-end checkpoint.
void end_epoch(Run& run, int64_t epoch, const EpochSums& totals, const EpochStart& start, ProgressBar* bar) {
  detail::set_lr(run.optimizer, scheduled_lr(run.o, epoch + 1, steps_taken(run.position)));
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
    r.loss_scale = run.loss_scale();
    r.lr = current_lr(run.optimizer);
    run.metrics->write(r);
    if (run.tensorboard) log_to_tensorboard(*run.tensorboard, r);
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

// ---- TrainOptions::cuda_graphs ----

// The graphed step: the eager step itself (train_step, added to the run's tally), captured. One worker
// only: DDP's collectives are not captured. On the CPU (the tests' uncaptured_graph_step) none: the
// eager step is the path a GPU captures, and the host reads as on a GPU (Run::reads_every_step).
std::unique_ptr<detail::GraphedTrainStep> make_graphed_step(Run& run) {
  TORCH_CHECK(run.workers.world == 1,
              "TrainOptions::cuda_graphs: one worker only for now (DDP's collectives are "
              "not captured); use --nproc 1, or drop --cuda-graphs (docs/gpu.md)");
  if (run.faults.uncaptured_graph_step) return nullptr;
  return std::make_unique<detail::GraphedTrainStep>([&run](const torch::Tensor& data, const torch::Tensor& target) {
    run.tally.add_on_device(train_step(run, data, target), target);
  });
}

// One epoch; false when TrainOptions::steps stopped it before its end (the checkpoint written
// there holds the position).
bool run_epoch(Run& run, int64_t epoch, bool tty) {
  BatchIterator indexed = epoch_batches(run, epoch);
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
  run.last_train_loss = totals.loss_sum / std::max(totals.seen, 1.0);
  run.last_eval = evaluate(run);
  if (!whole_epoch) return false;
  end_epoch(run, epoch, totals, start, bar ? &*bar : nullptr);
  return true;
}

// ---- outputs ----

void open_outputs(Run& run) {
  if (run.workers.leader()) {
    fs::create_directories(run.o.out());
    // summary.json means "complete outputs": an earlier run's must not sit beside this run's partial ones.
    fs::remove(fs::path(run.o.out()) / "summary.json");
    run.metrics.emplace((fs::path(run.o.out()) / "metrics.jsonl").string(), /*append=*/run.resumed);
    if (!run.o.tensorboard().empty()) run.tensorboard.emplace(run.o.tensorboard());
  }
  run.say(fmt::format("ampp train: {} on {}; {}; {} worker(s) x {} {}/batch, {} thread(s) each", run.o.model(),
                      run.data.description, precision_label(run.o, run.amp), run.workers.world, run.per_rank_batch,
                      run.data.train.tokens ? "sequences" : "images", run.workers.threads));
  if (run.data.unigram_loss)
    run.say(fmt::format("ampp train: the validation text's unigram baseline loss is {:.4f} (perplexity {:.2f})",
                        *run.data.unigram_loss, std::exp(*run.data.unigram_loss)));
  if (!run.data_placement.empty()) run.say(run.data_placement);
  if (!run.communication.empty()) run.say(run.communication);
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
  const auto images_per_step = static_cast<double>(run.per_rank_batch * run.workers.world);
  s.wall_images_per_sec = s.seconds > 0 ? static_cast<double>(s.steps) * images_per_step / s.seconds : 0;
  s.steady_steps = run.steady.seconds > 0 ? run.steady.steps : 0;
  s.images_per_sec = s.steady_steps > 0 ? static_cast<double>(run.steady.steps) * images_per_step / run.steady.seconds
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
  for (size_t k = 0; k < kNumStepPhases; ++k) rows[run.workers.rank][static_cast<int64_t>(k)] = run.phases.seconds[k];
  rows[run.workers.rank][columns - 1] = static_cast<double>(run.phases.steps);
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
void write_outputs(Run& run, const Summary& summary, bool write_model = true) {
  if (!run.workers.leader()) return;
  const fs::path out(run.o.out());
  if (write_model)
    save_fp32_model(*run.model, run, (out / "model.pt").string());
  else
    run.say("model.pt was not written: the weights or the test loss are not finite (the diagnosis is the result)");
  run.metrics->write_line(to_json(summary));
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
      const auto pngs = write_plots(run.metrics->path(), run.o.out());
      run.say(fmt::format("plots: {}", fmt::join(pngs, ", ")));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ampp train: warning: plots not written: %s\n", e.what());
    }
  }
  write_doctor_outputs(run);
  run.say(fmt::format("metrics: {}", run.metrics->path()));
  if (run.tensorboard)
    run.say(
        fmt::format("tensorboard: {} (view: tensorboard --logdir {})", run.tensorboard->path(), run.o.tensorboard()));
}

// Whether every worker has a GPU of its own (NCCL refuses two ranks on one device): all workers agree.
bool every_worker_has_its_own_gpu(const Run& run) {
  const auto gpus = static_cast<int64_t>(torch::cuda::device_count());
  const bool own = !device_of(run.o).has_index() && run.workers.pg.local_size() <= gpus;
  auto count = torch::tensor({own ? 1.0 : 0.0}, torch::kFloat64);
  allreduce_sum(run.workers.pg, count);
  return count.item<double>() == run.workers.world;
}

// DDP on GPUs: with one GPU per worker, each bucket's allreduce runs through NCCL on NCCL's stream while
// the backward goes on (torch.distributed's choice for CUDA tensors), over a subgroup of all the workers
// whose backend is NCCL; the run's own group stays Gloo for the host's sums. Workers that share a GPU, and
// --gloo-allreduce, reduce the CUDA gradients through Gloo (ampp's shared memory reads host memory).
dist::ProcessGroup gpu_gradient_group(Run& run) {
  const bool nccl =
      run.o.shared_memory_allreduce() && dist::is_backend_available("nccl") && every_worker_has_its_own_gpu(run);
  if (!nccl) {
    run.communication = fmt::format(
        "DDP: {} workers reduce CUDA gradients through Gloo ({})", run.workers.world,
        run.o.shared_memory_allreduce() ? "they share GPUs; NCCL needs one per worker" : "--gloo-allreduce");
    return run.workers.pg;
  }
  std::vector<int> everyone(static_cast<size_t>(run.workers.world));
  std::iota(everyone.begin(), everyone.end(), 0);
  run.communication =
      fmt::format("DDP: {} workers, one GPU each, reduce CUDA gradients through NCCL", run.workers.world);
  return dist::new_group(run.workers.pg, everyone, "nccl");
}

// DDP over the workers; the workers of each machine reduce through shared memory, and only one per machine
// talks to the other machines.
void start_ddp(Run& run) {
  // Each .grad a slot of its bucket: the reduced bucket is the gradient, with no copy back into a separate
  // .grad per parameter (10 of the CNN's 73 copies per step, 0.7 of 2.3 ms in the operator profile).
  const auto options = dist::DistributedDataParallelOptions().gradient_as_bucket_view(true);
  if (run.device.is_cuda()) {
    run.ddp.emplace(run.model, gpu_gradient_group(run), options);
    // Their groups are set where the model and the optimizer are made, before DDP's: the run's own.
    if (run.o.sync_batch_norm() || run.o.zero())
      run.communication += "; SyncBatchNorm and ZeRO go through the run's Gloo group (CUDA tensors via the host)";
    return;
  }
  run.ddp.emplace(run.model, run.workers.pg, options);
  if (!run.o.shared_memory_allreduce()) {
    run.communication = fmt::format("DDP: {} workers reduce through Gloo (--gloo-allreduce)", run.workers.world);
    return;
  }
  const auto machines = dist::group_by_machine(run.workers.pg);
  run.ddp->register_comm_hook(dist::hierarchical_allreduce_hook(machines));
  run.ddp->register_buffer_broadcast(dist::hierarchical_buffer_broadcast(machines));
  run.communication =
      machines.machines() == 1
          ? fmt::format("DDP: {} workers on this machine reduce through shared memory", run.workers.world)
          : fmt::format(
                "DDP: {} workers on {} machines reduce through shared memory within each machine and "
                "through Gloo between one worker per machine",
                run.workers.world, machines.machines());
}

// ---- a finished run, resumed ----

bool nothing_left(const Run& run) { return reached_step_limit(run) || run.position.epoch >= run.o.epochs(); }

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

// Resuming a run that already finished changes nothing: its stored summary is the result. When
// its outputs are missing (a worker died between the last checkpoint and summary.json), they are
// rebuilt from the checkpoint: the same model, a deterministic evaluation, the stored train loss.
Summary finish_finished_run(Run& run) {
  std::optional<Summary> stored;
  on_leader_agreed(run.workers, [&] { stored = stored_summary(run); });
  auto found = torch::tensor({stored ? 1.0 : 0.0}, torch::kFloat64);
  allreduce_sum(run.workers.pg, found);
  // Every rank computes the final numbers (collectives), as the run's last epoch did.
  run.epochs_done = run.position.epoch;
  const EpochSums totals = global_totals(run.workers.pg, run.sums);
  run.last_train_loss =
      run.position.batch > 0 ? totals.loss_sum / std::max(totals.seen, 1.0) : run.position.last_train_loss;
  run.last_eval = evaluate(run);
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

}  // namespace

Summary train(const TrainOptions& options) {
  validate(options);
  // Before any tensor exists, so that every one is counted.
  const TensorMemoryTracker* tracker = options.profile() ? &TensorMemoryTracker::install() : nullptr;
  retain_freed_memory();  // no page faults on the same activation buffers every step (allocator.h)
  Workers workers = set_up_workers(options);
  const auto lock = claim_outputs(options, workers);  // before the data is loaded: fail in seconds
  Run run(options, std::move(workers));
  resume(run);
  resume_from_pytorch(run);
  if (run.resumed && nothing_left(run)) return finish_finished_run(run);
  // DDP after the resume, so its construction broadcast starts every rank from the loaded weights.
  if (run.workers.world > 1 && !run.fsdp) start_ddp(run);
  run.started = Clock::now();
  dist::report_progress(run.position.global_step);  // watched by the launcher from here on
  open_outputs(run);
  if (options.doctor() && run.workers.leader()) run.ranges.emplace();
  if (options.profile() && run.workers.leader()) run.op_recorder.emplace();  // DDP's gradients are alike on every rank
  run.faults = detail::faults_for(run.workers.rank, run.workers.world, run.workers.restarted);
  run.reads_every_step = (!run.device.is_cuda() && !run.faults.uncaptured_graph_step) || options.doctor();
  if (options.cuda_graphs()) {
    run.graphed = make_graphed_step(run);
    run.say("CUDA graphs: each step is one graph replay");
  }
  run.epochs_done = run.position.epoch;
  run.model->train();
  const bool tty = is_terminal(stdout);
  for (int64_t epoch = run.position.epoch; epoch < options.epochs() && !reached_step_limit(run); ++epoch) {
    if (!run_epoch(run, epoch, tty)) break;
  }
  Summary summary = summarize(run);
  summary.step_phases = gather_step_phases(run);
  summary.ops = run.ops;
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
