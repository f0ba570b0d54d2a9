#include "run.h"
#include "workers.h"

namespace ampp::train::detail {

// Builds the run in the order the seeds build it.
Run::Run(const TrainOptions& options, Workers workers_in)
    : o(options),
      workers(std::move(workers_in)),
      device(worker_device(o, workers)),
      data(load_dataset(data_spec(o), o.seed(), o.num_classes(),
                        DataLoading().map_files(o.map_data()).context(context_of(o)))),
      per_rank_batch(o.batch_size() / workers.world),  // seed 000: int(batch_size / ngpus_per_node)
      model_options(model_options_for(data.train, o)),
      model(seeded_model(o, model_options, device)),
      fsdp(make_fsdp(o, model, workers.pg, device)),
      optimizer_holder(make_optimizer(fsdp ? fsdp->parameters() : model->parameters(), o, workers.pg,
                                      uses_fused_optimizer(o, device.is_cuda()))),
      optimizer(*optimizer_holder),
      amp(initialize(std::static_pointer_cast<torch::nn::Module>(model), optimizer, amp_properties(o))),
      buffer_guard(*model),  // after initialize(), which may cast the buffers
      sampler(static_cast<size_t>(data.train.size()),
              dist::DistributedSamplerOptions().num_replicas(workers.world).rank(workers.rank).seed(o.seed())),
      checkpoint(o.checkpoint_dir().empty() ? "" : checkpoint_path(o)) {
  TORCH_CHECK(per_rank_batch >= 1, "TrainOptions::batch_size ", o.batch_size(),
              " is smaller than the number of workers (", workers.world, "); use at least one image per worker");
  TORCH_CHECK(per_rank_batch % o.grad_accum() == 0, "TrainOptions::grad_accum ", o.grad_accum(),
              " does not divide each worker's batch of ", per_rank_batch, " (batch_size ", o.batch_size(), " over ",
              workers.world, " workers) into equal micro-batches; use a batch size that is a multiple of ",
              o.grad_accum() * workers.world);
  report.data_placement = place_data(data, device);
  cosine_steps = cosine_steps_of(o, static_cast<int64_t>(sampler.size()) / per_rank_batch);
  const int64_t last_step = o.warmup_steps() + (o.lr_schedule() == LrSchedule::kCosine ? cosine_steps : 0);
  const bool float_lr = device.is_cuda() && dynamic_cast<GradScaleAwareOptimizer*>(&optimizer) != nullptr;
  lr.emplace([this](int64_t epoch, int64_t taken) { return scheduled_lr(o, epoch, taken, cosine_steps); }, last_step,
             device, float_lr);
  if (fsdp) amp.set_found_inf_reducer(fsdp->found_inf_hook());  // each rank unscales only its shards
  if (device.is_cuda()) at::globalContext().setBenchmarkCuDNN(o.cudnn_benchmark() && !o.deterministic());
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
  if (o.fp8()) {
    convert_to_float8_training(*model, Float8LinearConfig().recipe(*o.fp8()).amax_history_len(o.fp8_amax_history()),
                               o.fp8_all_layers() ? fits_fp8_kernels_filter() : auto_filter_for_recipe(*o.fp8()));
  }
  model->to(device);
  return model;
}

torch::optim::SGDOptions sgd_options(const TrainOptions& o) {
  return torch::optim::SGDOptions(*o.lr()).momentum(o.momentum()).weight_decay(*o.weight_decay());
}

// nanoGPT's AdamW (train.py: beta2 0.95 for its batch sizes; PyTorch's eps).
torch::optim::AdamWOptions adamw_options(const TrainOptions& o) {
  return torch::optim::AdamWOptions(*o.lr()).betas({0.9, 0.95}).eps(1e-8).weight_decay(*o.weight_decay());
}

std::vector<torch::optim::OptimizerParamGroup> param_groups_for(const std::vector<torch::Tensor>& params,
                                                                const TrainOptions& o) {
  using torch::optim::OptimizerParamGroup;
  if (o.optimizer() == OptimizerKind::kSgd)
    return {OptimizerParamGroup(params, std::make_unique<torch::optim::SGDOptions>(sgd_options(o)))};
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(adamw_options(o)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(adamw_options(o).weight_decay(0)));
  return groups;
}

std::unique_ptr<torch::optim::Optimizer> plain_optimizer(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                                         const TrainOptions& o, bool fused) {
  if (o.optimizer() == OptimizerKind::kAdamW) {
    if (fused) return std::make_unique<FusedAdamW>(groups, adamw_options(o));
    return std::make_unique<torch::optim::AdamW>(groups, adamw_options(o));
  }
  if (fused) return std::make_unique<FusedSGD>(groups, sgd_options(o));
  return std::make_unique<torch::optim::SGD>(groups, sgd_options(o));
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

// TrainOptions::optimizer; with TrainOptions::zero and several workers, its state sharded over them.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& params, const TrainOptions& o,
                                                        const dist::ProcessGroup& pg, bool fused) {
  const auto groups = param_groups_for(params, o);
  // PyTorch's fused kernels (TrainOptions::fused_optimizer; on a GPU by default): one launch for every
  // parameter. ZeRO's local optimizer too, which it hands the skip flag and the lr tensor: --zero reads
  // nothing on the host.
  if (!o.zero() || !pg) return plain_optimizer(groups, o, fused);
  return std::make_unique<dist::ZeroRedundancyOptimizer>(
      groups,
      [o, fused](const std::vector<torch::optim::OptimizerParamGroup>& g) { return plain_optimizer(g, o, fused); },
      dist::ZeroRedundancyOptimizerOptions().process_group(pg));
}

// Cross-entropy over the last dimension of the logits: [N, classes] against [N], or a GPT's
// [N, T, vocabulary] against [N, T] (every position is a prediction of the next token).
torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& target,
                                  torch::nn::functional::CrossEntropyFuncOptions::reduction_t reduction) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}),
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(reduction));
}

namespace {

// A dataset of at most this many bytes lives on the GPU, where each batch is gathered by index on the
// device: no host work, no copy and no loader thread per step (Fashion-MNIST: 55 MB; synthetic:32768:
// 103 MB). Larger ones stay on the host and are copied batch by batch.
constexpr int64_t kDataOnGpuBytes = int64_t{4} << 30;

int64_t bytes_of(const Dataset& d) { return d.images.nbytes() + d.labels.nbytes(); }

}  // namespace

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

// The run's identity in its checkpoint. The loss scale is part of it (a different one on resume would
// be silently replaced by the checkpoint's); checkpoints written before it was added omit it.
std::string fingerprint(const TrainOptions& o, int world, int64_t cosine_steps, bool with_loss_scale) {
  std::string f = fmt::format("model={} data={} opt_level={} dtype={} batch_size={} world_size={} seed={}", o.model(),
                              dataset_name(data_spec(o)), to_string(o.opt_level()), c10::toString(o.dtype()),
                              o.batch_size(), world, o.seed());
  if (is_gpt(o.model()))
    f += fmt::format(" context={} n_layer={} n_head={} n_embd={}", context_of(o), o.n_layer(), o.n_head(), o.n_embd());
  if (with_loss_scale) f += " loss_scale=" + amp_properties(o).loss_scale().to_string();
  if (o.warmup_steps() > 0) f += fmt::format(" warmup_steps={}", o.warmup_steps());  // absent before warmup
  if (o.grad_accum() > 1) f += fmt::format(" grad_accum={}", o.grad_accum());        // other rounding
  if (o.fp8()) f += fmt::format(" fp8={}{}", to_string(*o.fp8()), o.fp8_all_layers() ? ":all" : "");
  if (o.fp8() == Float8Recipe::kDelayed) f += fmt::format(" fp8_amax_history={}", o.fp8_amax_history());
  // Absent for SGD and StepLR, which every checkpoint before them used.
  if (o.optimizer() != OptimizerKind::kSgd) f += " optimizer=" + to_string(*o.optimizer());
  if (o.lr_schedule() != LrSchedule::kStep)
    f += fmt::format(" lr_schedule={} lr_decay_steps={}", to_string(*o.lr_schedule()), cosine_steps);
  return f;
}

bool same_run(const std::string& saved, const TrainOptions& o, int world, int64_t cosine_steps) {
  const bool has_loss_scale = saved.find(" loss_scale=") != std::string::npos;
  return saved == fingerprint(o, world, cosine_steps, has_loss_scale);
}

// "fp8 tensorwise in 8 of 8 Linear layers" (TrainOptions::fp8), or "".
std::string fp8_label(const TrainOptions& o, const torch::nn::Module& model) {
  if (!o.fp8()) return "";
  int64_t layers = 0, converted = 0;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    const auto* l = m->as<Float8LinearImpl>();
    if (!l) continue;
    ++layers;
    converted += l->float8() ? 1 : 0;
  }
  std::string label = fmt::format(", fp8 {} in {} of {} Linear layers", to_string(*o.fp8()), converted, layers);
  if (converted == 0 && !o.fp8_all_layers())
    label += " (no shape here is one where fp8 pays, torchao's filter; --fp8-layers all converts them all)";
  return label;
}

std::string precision_label(const TrainOptions& o, const Amp& amp, const torch::nn::Module& model) {
  if (o.opt_level() == OptLevel::O0) return "O0 (fp32)";
  return fmt::format("{} {}{}, loss scale {}{}", to_string(o.opt_level()), low_precision_dtype_name(o.dtype()),
                     amp.fp16_emulated() ? " (emulated on CPU)" : "", amp.properties().loss_scale().to_string(),
                     fp8_label(o, model));
}

// See Note [the step's lr] (step_lr.h): StepLr looks this function's values up at each step.
//
// The learning rate of a step in `epoch` after `steps_taken` optimizer steps (skipped ones excluded).
// A function of the two counts, both in the checkpoint, so a resumed run gets the same schedule bit
// for bit. The decay is LibTorch's StepLR stepped once per epoch (lr * gamma, multiplied in turn; its
// first decay applies to epoch lr_step + 1, one epoch later than PyTorch's StepLR); warmup scales it.
double scheduled_lr(const TrainOptions& o, int64_t epoch, int64_t steps_taken, int64_t cosine_steps) {
  double lr = *o.lr();
  if (o.lr_schedule() == LrSchedule::kCosine) {
    // nanoGPT's get_lr after its warmup: min_lr + (lr - min_lr) * (1 + cos(pi * ratio)) / 2, min_lr = lr / 10.
    const double ratio = std::clamp(
        static_cast<double>(steps_taken - o.warmup_steps()) / static_cast<double>(std::max<int64_t>(cosine_steps, 1)),
        0.0, 1.0);
    const double min_lr = *o.lr() / 10;
    lr = min_lr + (*o.lr() - min_lr) * 0.5 * (1.0 + std::cos(M_PI * ratio));
  }
  for (int64_t e = 1; o.lr_step() > 0 && e < epoch; ++e)
    if (e % o.lr_step() == 0) lr = o.lr_gamma() * lr;
  if (steps_taken < o.warmup_steps())
    lr *= static_cast<double>(steps_taken + 1) / static_cast<double>(o.warmup_steps());
  return lr;
}

int64_t cosine_steps_of(const TrainOptions& o, int64_t steps_per_epoch) {
  if (o.lr_decay_steps() > 0) return o.lr_decay_steps();
  int64_t total = o.epochs() * steps_per_epoch;
  if (o.steps() > 0) total = std::min(total, o.steps());
  return std::max<int64_t>(total - o.warmup_steps(), 1);
}

int64_t steps_taken(const RunPosition& p) { return p.global_step - p.skipped_total; }

bool reached_step_limit(const Run& run) { return run.o.steps() > 0 && run.position.global_step >= run.o.steps(); }

}  // namespace ampp::train::detail
