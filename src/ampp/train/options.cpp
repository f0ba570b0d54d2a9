// TrainOptions: the one place its values are checked. Errors name the field as
// "TrainOptions::<field>"; `ampp train` shows them as the flag that sets it.
#include <ampp/train/gpt.h>
#include <ampp/train/models.h>
#include <ampp/train/options.h>

#include "fault_injection.h"

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

namespace ampp::train {
namespace {

bool is_positive(double v) { return v > 0 && std::isfinite(v); }

void validate_gpt_sizes(const TrainOptions& o) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"context", o.context()},
                                    {"n_layer", o.n_layer()},
                                    {"n_head", o.n_head()},
                                    {"n_embd", o.n_embd()}}) {
    TORCH_CHECK(value >= 0 && value <= 1000000, "TrainOptions::", name,
                " must be 0 (the preset's) or a positive size up to 1000000, got ", value);
    TORCH_CHECK(value == 0 || is_gpt(o.model()), "TrainOptions::", name, " sets a GPT's size, but the model is ",
                o.model(), "; use --model gpt-tiny, gpt-mini or gpt2-124m, or drop it");
  }
}

void validate_fp8(const TrainOptions& o) {
  TORCH_CHECK(!o.fp8_all_layers() || o.fp8(), "TrainOptions::fp8_all_layers chooses the fp8 layers; add --dtype fp8");
  TORCH_CHECK(o.fp8_amax_history() == TrainOptions().fp8_amax_history() || o.fp8() == Float8Recipe::kDelayed,
              "TrainOptions::fp8_amax_history is the delayed recipe's; add --dtype fp8 --fp8-recipe delayed");
  TORCH_CHECK(o.fp8_amax_history() >= 1 && o.fp8_amax_history() <= 1000000,
              "TrainOptions::fp8_amax_history must be 1 to 1000000 passes, got ", o.fp8_amax_history());
  if (!o.fp8()) return;
  TORCH_CHECK(ampp::float8_supported(), "TrainOptions::fp8 needs LibTorch 2.6 or newer (float8 types and _scaled_mm)");
  TORCH_CHECK(is_gpt(o.model()), "TrainOptions::fp8: fp8 products are the GPTs' Linear layers; ", o.model(),
              " has none to convert: use --model gpt-tiny, gpt-mini or gpt2-124m, or --dtype bf16");
  TORCH_CHECK(o.opt_level() == OptLevel::O1 || o.opt_level() == OptLevel::O2, "TrainOptions::fp8 with ",
              to_string(o.opt_level()), ": fp8 Linear layers beside bf16 run at -O1 (autocast) or -O2 (bf16 model)");
  TORCH_CHECK(o.dtype() == c10::kBFloat16, "TrainOptions::fp8 keeps the rest of the model in bf16, and dtype is ",
              c10::toString(o.dtype()));
}

void validate_model_and_precision(const TrainOptions& o) {
  const auto& names = model_names();
  TORCH_CHECK(std::find(names.begin(), names.end(), o.model()) != names.end(), "TrainOptions::model '", o.model(),
              "' is unknown; choose one of: mlp, cnn, resnet, gpt-tiny, gpt-mini, gpt2-124m");
  TORCH_CHECK(o.num_classes() == 0 || (o.num_classes() >= 2 && o.num_classes() <= 100000),
              "TrainOptions::num_classes must be 0 (from the data) or 2 to 100000, got ", o.num_classes());
  TORCH_CHECK(o.dtype() == c10::kHalf || o.dtype() == c10::kBFloat16, "TrainOptions::dtype must be bf16 or fp16, got ",
              c10::toString(o.dtype()));
  TORCH_CHECK(!(o.sync_batch_norm() && (o.model() == "mlp" || is_gpt(o.model()))),
              "TrainOptions::sync_batch_norm: ", o.model(),
              " has no BatchNorm to synchronise; use --model cnn or resnet, or drop --sync-bn");
  validate_gpt_sizes(o);
  validate_fp8(o);
  const bool text = data_spec(o) == "text" || data_spec(o).rfind("text:", 0) == 0;
  TORCH_CHECK(text == is_gpt(o.model()), "TrainOptions::data '", o.data(), "' ",
              text ? "is text, which only the GPTs read; use --model gpt-tiny (or gpt-mini, gpt2-124m)"
                   : "holds images, which the GPTs cannot read; use --data text or text:FILE, or an image model");
}

void validate_optimization(const TrainOptions& o) {
  TORCH_CHECK(o.batch_size() >= 1, "TrainOptions::batch_size must be at least 1, got ", o.batch_size());
  TORCH_CHECK(o.epochs() >= 1, "TrainOptions::epochs must be at least 1, got ", o.epochs());
  TORCH_CHECK(o.steps() >= 0, "TrainOptions::steps must be 0 (no limit) or positive, got ", o.steps());
  TORCH_CHECK(is_positive(*o.lr()), "TrainOptions::lr must be a positive number, got ", *o.lr());
  TORCH_CHECK(o.momentum() >= 0 && o.momentum() < 1, "TrainOptions::momentum must be in [0, 1), got ", o.momentum());
  TORCH_CHECK(*o.weight_decay() >= 0 && std::isfinite(*o.weight_decay()),
              "TrainOptions::weight_decay must be >= 0, got ", *o.weight_decay());
  TORCH_CHECK(o.lr_step() >= 0, "TrainOptions::lr_step must be 0 (constant lr) or a positive number of epochs, got ",
              o.lr_step());
  TORCH_CHECK(o.lr_gamma() > 0 && o.lr_gamma() <= 1, "TrainOptions::lr_gamma must be in (0, 1], got ", o.lr_gamma());
  TORCH_CHECK(o.lr_decay_steps() >= 0,
              "TrainOptions::lr_decay_steps must be 0 (to the run's last step) or a positive number of steps, got ",
              o.lr_decay_steps());
  TORCH_CHECK(
      !(o.lr_schedule() == LrSchedule::kCosine && o.lr_step() > 0),
      "TrainOptions::lr_step is StepLR's, and the schedule is cosine (a GPT's default); add --lr-schedule step, "
      "or drop --lr-step");
  TORCH_CHECK(o.lr_decay_steps() == 0 || o.lr_schedule() == LrSchedule::kCosine,
              "TrainOptions::lr_decay_steps sets the cosine schedule's length; add --lr-schedule cosine or drop it");
  TORCH_CHECK(o.warmup_steps() >= 0, "TrainOptions::warmup_steps must be 0 (off) or a positive number of steps, got ",
              o.warmup_steps());
  TORCH_CHECK(o.grad_accum() >= 1 && o.grad_accum() <= 4096,
              "TrainOptions::grad_accum must be 1 (off) to 4096 micro-batches, got ", o.grad_accum());
  TORCH_CHECK(o.batch_size() % o.grad_accum() == 0, "TrainOptions::grad_accum ", o.grad_accum(),
              " does not divide TrainOptions::batch_size ", o.batch_size(),
              " into equal micro-batches; use a batch size that is a multiple of it");
  TORCH_CHECK(o.max_consecutive_skips() >= 0,
              "TrainOptions::max_consecutive_skips must be 0 (never stop) or a positive number of steps, got ",
              o.max_consecutive_skips());
  TORCH_CHECK(*o.clip_grad_norm() >= 0 && std::isfinite(*o.clip_grad_norm()),
              "TrainOptions::clip_grad_norm must be 0 (off) or a positive max norm, got ", *o.clip_grad_norm());
}

void validate_device(const TrainOptions& o) { usable_device(o.device(), "TrainOptions::device"); }

// What --fsdp does not combine with yet, each refused with what to do instead.
void validate_fsdp(const TrainOptions& o) {
  if (!o.fsdp()) return;
  TORCH_CHECK(
      o.opt_level() == OptLevel::O0 || o.opt_level() == OptLevel::O1, "TrainOptions::fsdp with ",
      to_string(o.opt_level()),
      ": FSDP keeps FP32 shards itself, so apex's FP32 masters (O2) and a low-precision model (O3) do not apply; "
      "use -O0 or -O1 (autocast)");
  TORCH_CHECK(!o.zero(), "TrainOptions::fsdp already shards the optimizer state; drop --zero");
  TORCH_CHECK(o.grad_accum() == 1,
              "TrainOptions::grad_accum under FSDP is not built yet (its gradients are "
              "reduced into shards at every backward); use DDP or --zero, or drop it");
  TORCH_CHECK(
      !o.doctor() && !o.profile(),
      "TrainOptions::fsdp: --doctor and --profile read whole gradients and parameters, which FSDP does not keep; "
      "drop them");
}

// What --cuda-graphs cannot capture, each refused with what to do instead.
void validate_cuda_graphs(const TrainOptions& o) {
  if (!o.cuda_graphs()) return;
  const auto no = [](const char* what) { return std::string("TrainOptions::cuda_graphs: ") + what + " (docs/gpu.md)"; };
  TORCH_CHECK(!o.doctor() && !o.profile(), no("--doctor and --profile read every step on the host; drop them"));
  TORCH_CHECK(
      o.fused_optimizer().value_or(true),
      no("the step needs ampp's fused optimizer (FusedSGD, FusedAdamW), which keeps the skip decision on the GPU; "
         "drop --no-fused-optimizer"));
  // Last, so that the CPU tests see the refusals above. The step a graph captures runs on the CPU eagerly with
  // --host-reads log-points.
  TORCH_CHECK(o.device() != "cpu", no("CUDA graphs need a GPU; use --device cuda, or drop --cuda-graphs (the CPU "
                                      "runs the same step eagerly, reading as a GPU run reads, with --host-reads "
                                      "log-points)"));
}

void validate_run_and_outputs(const TrainOptions& o) {
  TORCH_CHECK(o.threads() >= 0 && o.threads() <= 1024,
              "TrainOptions::threads must be 0 (automatic) or a count from 1 to 1024, got ", o.threads());
  TORCH_CHECK(o.timeout() >= 1 && o.timeout() <= 1e7, "TrainOptions::timeout must be from 1 to 1e7 seconds, got ",
              o.timeout());
  TORCH_CHECK(o.checkpoint_every() >= 0,
              "TrainOptions::checkpoint_every must be 0 (every epoch only) or a positive number of steps");
  TORCH_CHECK(!(o.checkpoint_every() > 0 && o.checkpoint_dir().empty()),
              "TrainOptions::checkpoint_every needs TrainOptions::checkpoint_dir (where to write the checkpoints)");
  TORCH_CHECK(!(o.resume() && o.checkpoint_dir().empty()),
              "TrainOptions::resume needs TrainOptions::checkpoint_dir (where the checkpoint is)");
  TORCH_CHECK(!o.out().empty(), "TrainOptions::out must name a folder");
  TORCH_CHECK(o.log_every() >= 1, "TrainOptions::log_every must be at least 1");
}

}  // namespace

OptimizerKind parse_optimizer_kind(const std::string& text) {
  if (text == "sgd") return OptimizerKind::kSgd;
  TORCH_CHECK(text == "adamw", "unknown optimizer '", text, "': use sgd or adamw");
  return OptimizerKind::kAdamW;
}

std::string to_string(OptimizerKind kind) { return kind == OptimizerKind::kSgd ? "sgd" : "adamw"; }

LrSchedule parse_lr_schedule(const std::string& text) {
  if (text == "step") return LrSchedule::kStep;
  TORCH_CHECK(text == "cosine", "unknown lr schedule '", text, "': use step or cosine");
  return LrSchedule::kCosine;
}

std::string to_string(LrSchedule schedule) { return schedule == LrSchedule::kStep ? "step" : "cosine"; }

HostReads parse_host_reads(const std::string& text) {
  if (text == "auto") return HostReads::kAuto;
  if (text == "every-step") return HostReads::kEveryStep;
  TORCH_CHECK(text == "log-points", "unknown host reads '", text, "': use auto, every-step or log-points");
  return HostReads::kLogPoints;
}

bool uses_fused_optimizer(const TrainOptions& o, bool gpu_step) { return o.fused_optimizer().value_or(gpu_step); }

bool uses_loader_thread(const TrainOptions& o, bool gpu_step) { return o.prefetch_batches().value_or(gpu_step); }

bool reads_every_step(const TrainOptions& o, bool gpu_step) {
  if (o.doctor()) return true;  // it inspects every step
  if (o.host_reads() == HostReads::kAuto) return !gpu_step;
  return o.host_reads() == HostReads::kEveryStep;
}

TrainOptions with_model_defaults(TrainOptions o) {
  const bool gpt = is_gpt(o.model());
  if (!o.optimizer()) o.optimizer(gpt ? OptimizerKind::kAdamW : OptimizerKind::kSgd);
  const bool adamw = *o.optimizer() == OptimizerKind::kAdamW;
  if (!o.lr()) o.lr(adamw ? 6e-4 : 0.05);  // nanoGPT's train.py; the seeds' SGD
  if (!o.weight_decay()) o.weight_decay(adamw ? 0.1 : 1e-4);
  if (!o.lr_schedule()) o.lr_schedule(gpt ? LrSchedule::kCosine : LrSchedule::kStep);
  if (!o.clip_grad_norm()) o.clip_grad_norm(gpt ? 1.0 : 0.0);
  return o;
}

void validate(const TrainOptions& unresolved) {
  const TrainOptions options = with_model_defaults(unresolved);
  validate_model_and_precision(options);
  validate_optimization(options);
  validate_run_and_outputs(options);
  validate_device(options);
  validate_fsdp(options);
  validate_cuda_graphs(options);
}

torch::Device usable_device(const std::string& text, const std::string& what) {
  std::optional<torch::Device> device;
  try {
    device = torch::Device(text);
  } catch (const c10::Error&) {
  }
  TORCH_CHECK(device && (device->is_cpu() || device->is_cuda()), what, " must be cpu, cuda or cuda:N, got '", text,
              "'");
  if (device->is_cpu()) return *device;
  TORCH_CHECK(torch::cuda::is_available(), what, " '", text,
              "': no CUDA GPU is visible to this process (a CPU-only LibTorch, or no GPU or driver); use --device cpu, "
              "or build with AMPP_TORCH=cuda on a machine with a GPU");
  TORCH_CHECK(!device->has_index() || device->index() < static_cast<int>(torch::cuda::device_count()), what, " '", text,
              "': this process sees ", torch::cuda::device_count(), " GPU(s)");
  return *device;
}

torch::Device device_of(const TrainOptions& options) { return torch::Device(options.device()); }

std::string data_spec(const TrainOptions& options) {
  if (options.data().empty() && is_gpt(options.model())) return "text";
  return options.data();
}

int64_t context_of(const TrainOptions& options) {
  if (options.context() != 0 || !is_gpt(options.model())) return options.context();
  return gpt_preset(options.model()).context();
}

std::string checkpoint_path(const TrainOptions& options) {
  return (std::filesystem::path(options.checkpoint_dir()) / "checkpoint.ampp").string();
}

std::string pytorch_checkpoint_path(const TrainOptions& options) {
  return (std::filesystem::path(options.checkpoint_dir()) / "checkpoint.pt").string();
}

}  // namespace ampp::train
