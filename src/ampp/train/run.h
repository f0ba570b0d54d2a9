#pragma once
// Internal to ampp: one worker's training run (`ampp train`), built in the order the seeds build it, and the
// small rules its parts share (the run's identity, the lr schedule, the loss).
#include <ampp/amp/initialize.h>
#include <ampp/dist/ddp.h>
#include <ampp/dist/fully_shard.h>
#include <ampp/dist/heartbeat.h>
#include <ampp/dist/hierarchical_allreduce.h>
#include <ampp/dist/process_group.h>
#include <ampp/dist/sampler.h>
#include <ampp/dist/sync_batch_norm.h>
#include <ampp/dist/zero_redundancy_optimizer.h>
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/numerics/unscale.h>
#include <ampp/precision/dtype.h>
#include <ampp/precision/float8_linear.h>
#include <ampp/precision/float8_ranges.h>
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
#include <ampp/train/named_master_params.h>
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
#include "buffer_guard.h"
#include "doctor.h"
#include "fault_injection.h"
#include "graphed_step.h"
#include "report_json.h"
#include "step_lr.h"
#include "step_tally.h"

namespace ampp::train::detail {

namespace fs = std::filesystem;

using Clock = std::chrono::steady_clock;
using Ddp = dist::DistributedDataParallel<std::shared_ptr<ClassifierImpl>>;

// This process's place among the workers and its compute threads.
struct Workers {
  dist::ProcessGroup pg;
  int rank = 0;
  int world = 1;
  int threads = 1;
  bool restarted = false;  // a later attempt under `ampp run --max-restarts`
  bool leader() const { return rank == 0; }
};

// The model's forward, through FSDP when the model is sharded.
struct ShardedForward {
  dist::FullyShardedDataParallel* fsdp;
  torch::Tensor forward(const torch::Tensor& x) { return fsdp->forward<ClassifierImpl>(x); }
};

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

// What a run reports, apart from what it trains and what a checkpoint holds: the lines it says, the metrics and
// the summary's parts, the doctor's findings and the step's phase times. The step writes here; nothing in it
// decides a step.
struct RunReport {
  std::string communication;   // how DDP's workers reduce, said after the run's first line
  std::string data_placement;  // where the data lives, said there too
  std::optional<MetricsWriter> metrics;
  std::optional<TensorBoardWriter> tensorboard;  // rank 0, TrainOptions::tensorboard
  int64_t epochs_done = 0;
  double last_train_loss = 0;
  Evaluation last_eval;
  // For the divergence message: the last finite loss and where it was.
  double last_finite_loss = std::numeric_limits<double>::quiet_NaN();
  int64_t last_finite_loss_step = 0;
  std::vector<std::string> last_overflowed;       // the parameters of the latest skipped step
  std::optional<GradientRanges> ranges;           // the numerics doctor's report (TrainOptions::doctor, rank 0)
  std::optional<Float8RangeRecorder> fp8_ranges;  // its fp8 part (TrainOptions::fp8 too)
  nlohmann::json first_non_finite;                // the doctor's replay of the first skipped step (null: none yet)
  StepPhases phases;                              // where this process's step time went
  PhaseClock clock{phases};
  std::optional<OpRecorder> op_recorder;  // TrainOptions::profile, rank 0: LibTorch's profiler over a window
  std::optional<OpProfile> ops;
  std::vector<std::string> step_overflowed;  // where reads_every_step: the last step's inf/NaN gradients
  SteadyRate steady;                         // images/s after warm-up, evaluation and checkpoints excluded
};

// Everything one worker's run holds, built in the order the seeds build it.
struct Run {
  // `options` with_model_defaults() already (train() resolves them), and outliving the run.
  Run(const TrainOptions& options, Workers workers_in);

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
  // Collectives on the model's device tensors during a step (the delayed fp8 amaxes): DDP's NCCL group where
  // it has one, so they stay on the device; else the run's own group.
  std::optional<dist::ProcessGroup> device_group;
  std::string checkpoint;    // "" = no checkpoints
  int64_t cosine_steps = 0;  // LrSchedule::kCosine: optimizer steps from the warmup's end to the floor
  RunPosition position;      // epoch/batch to start from; elapsed = seconds before this process
  EpochSums sums;            // the current epoch's running sums (this rank's; global totals on rank 0 after a save)
  bool resumed = false;
  Clock::time_point started = Clock::now();     // reset when training starts (after resume and DDP)
  detail::FaultInjection faults;                // test binaries only (fault_injection.h); none in ampp
  int64_t saves = 0;                            // checkpoints written by this process
  std::vector<torch::Tensor> gathered_masters;  // ZeRO under O2: every shard's masters, for the checkpoint
  // FSDP: the unsharded optimizer (SGD or AdamW, as the run's), while a checkpoint is written.
  std::unique_ptr<torch::optim::Optimizer> fsdp_optimizer;
  std::unique_ptr<detail::GraphedTrainStep> graphed;  // TrainOptions::cuda_graphs, else null
  // Each step's lr, looked up at the skip ledger's steps taken: Note [the step's lr] (step_lr.h).
  std::optional<detail::StepLr> lr;
  detail::StepTally tally{o.max_consecutive_skips(), o.log_every()};  // the steps' results until a read
  RunReport report;                                                   // what the run reports (above)
  // Note [what the host reads]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A step's results (loss, correct predictions, the skip flag: StepTally) stay on the device until the host
  // reads them, and on a GPU each read waits for the GPU. The one policy, decided here and applied in
  // train_batches() (trainer.cpp):
  //   - every step where a read costs nothing (the CPU) or the doctor inspects every step (this flag);
  //   - otherwise at log points, epoch ends and checkpoints only.
  // Nothing else in a step reads, except these, each one read per step and each citing this note:
  //   - the skip flag and the lr with a plain optimizer (--no-fused-optimizer): Amp::step's skip on the host,
  //     StepLr::apply(); ZeroRedundancyOptimizer with a plain local optimizer.
  //     The warmup and every schedule need no read: the lr is looked up at the skip ledger's steps taken
  //     on the device (Note [the step's lr], step_lr.h);
  //   - FSDP over Gloo (its found-inf reduction stages CUDA tensors through the host);
  //   - SyncBatchNorm's check of the global count, on the CPU only (sync_batch_norm.cpp);
  //   - the doctor (--doctor): the loss and the skip flag, for its report.
  // TrainOptions::host_reads sets it (reads_every_step() in options.cpp): --host-reads log-points lets the CPU
  // read as a GPU run does, which is how the CPU tests run the step a GPU captures.
  bool reads_every_step = true;
  torch::Tensor inf_factor;  // a test's inf injection (FaultInjection::inf_steps): 1 or +inf, on the device
};

// The host's view of the steps up to a read: the last step's loss, whether it stepped, and where a
// skipped step's gradients were inf/NaN (known only where the trainer reads every step).
struct StepResult {
  double loss = 0;
  bool stepped = false;                 // false: skipped after an overflow
  std::vector<std::string> overflowed;  // skipped: the parameters whose gradients were inf/NaN
};

// Under TrainOptions::profile, rank 0 records the operators of steps kOpWindowFirst+1 to
// kOpWindowFirst+kOpWindowSteps (after the first steps' one-off costs: oneDNN primitive creation, first
// page faults), or up to the end of that epoch (no evaluation in the window). Only a window: the
// profiler costs microseconds per operator.
constexpr int64_t kOpWindowFirst = 3, kOpWindowSteps = 20;

// Sums a small float64 vector over all ranks (no-op without a group).
void allreduce_sum(const dist::ProcessGroup& pg, torch::Tensor& t);

EpochSums global_totals(const dist::ProcessGroup& pg, const EpochSums& sums);

// The opt level's Properties with this run's dtype and loss scale.
Properties amp_properties(const TrainOptions& o);

ModelOptions model_options_for(const Dataset& train, const TrainOptions& o);

std::shared_ptr<ClassifierImpl> seeded_model(const TrainOptions& o, const ModelOptions& model_options,
                                             const torch::Device& device);

torch::optim::SGDOptions sgd_options(const TrainOptions& o);
torch::optim::AdamWOptions adamw_options(const TrainOptions& o);

// The parameters as the optimizer's groups: one for SGD; for AdamW nanoGPT's two, the matrices with weight
// decay and then every parameter of fewer than 2 dimensions (biases, norms' weights) without.
std::vector<torch::optim::OptimizerParamGroup> param_groups_for(const std::vector<torch::Tensor>& params,
                                                                const TrainOptions& o);
// TrainOptions::optimizer over `groups`, unsharded; ampp's fused kernel (one launch for all) when `fused`.
std::unique_ptr<torch::optim::Optimizer> plain_optimizer(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                                         const TrainOptions& o, bool fused);

// TrainOptions::fsdp with several workers: the model sharded, its sharding_units() the units. Before the
// optimizer, which steps the shards; a resume then loads each rank's shards (load_into_shards).
// On a GPU the shards are CUDA tensors, which the run's Gloo group reduces through the host (ampp's shared
// memory reads host memory only).
std::unique_ptr<dist::FullyShardedDataParallel> make_fsdp(const TrainOptions& o,
                                                          const std::shared_ptr<ClassifierImpl>& model,
                                                          const dist::ProcessGroup& pg, const torch::Device& device);

// TrainOptions::optimizer; with TrainOptions::zero and several workers, its state sharded over them.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& params, const TrainOptions& o,
                                                        const dist::ProcessGroup& pg, bool fused);

// Cross-entropy over the last dimension of the logits: [N, classes] against [N], or a GPT's
// [N, T, vocabulary] against [N, T] (every position is a prediction of the next token).
torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& target,
                                  torch::nn::functional::CrossEntropyFuncOptions::reduction_t reduction = torch::kMean);

// On a GPU: the data on the device when it fits (the same values and order as on the host). Says where.
std::string place_data(DatasetPair& data, const torch::Device& device);

// The run's identity in its checkpoint. The loss scale is part of it (a different one on resume would
// be silently replaced by the checkpoint's); checkpoints written before it was added omit it.
// Under the cosine schedule its length, `cosine_steps` (Run::cosine_steps), is part of it: resumed with more
// epochs or steps, the curve would not be the one the checkpoint's steps followed.
std::string fingerprint(const TrainOptions& o, int world, int64_t cosine_steps, bool with_loss_scale = true);

bool same_run(const std::string& saved, const TrainOptions& o, int world, int64_t cosine_steps);

std::string precision_label(const TrainOptions& o, const Amp& amp, const torch::nn::Module& model);

// The learning rate of a step in `epoch` after `steps_taken` optimizer steps (skipped ones excluded).
// A function of the two counts, both in the checkpoint, so a resumed run gets the same schedule bit
// for bit. LrSchedule::kStep: LibTorch's StepLR stepped once per epoch (lr * gamma, multiplied in turn;
// its first decay applies to epoch lr_step + 1, one epoch later than PyTorch's StepLR). kCosine: nanoGPT's
// cosine from lr to lr / 10 over `cosine_steps` steps after the warmup. Warmup scales either.
double scheduled_lr(const TrainOptions& o, int64_t epoch, int64_t steps_taken, int64_t cosine_steps);
// The cosine's length for a run of `steps_per_epoch`: TrainOptions::lr_decay_steps, or the steps left after
// the warmup until the run's last (at least 1).
int64_t cosine_steps_of(const TrainOptions& o, int64_t steps_per_epoch);

int64_t steps_taken(const RunPosition& p);

bool reached_step_limit(const Run& run);

}  // namespace ampp::train::detail
