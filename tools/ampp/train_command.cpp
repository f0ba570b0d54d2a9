// `ampp train`: train a model on Fashion-MNIST (or any MNIST-format folder, or synthetic data)
// with mixed precision and data-parallel workers. See docs/training.md.
//   ampp train                          # defaults: see docs/training.md (2 workers, O1 fp16, dynamic scaling)
//   ampp train --opt-level O2 --dtype bf16 --model resnet --epochs 5 --nproc 1
//
// Every flag sets one TrainOptions field, parsed by the library's own parser for its type and
// defaulted by TrainOptions itself. With --nproc N > 1 the command re-executes itself as N
// workers with exactly the user's arguments; the launcher's environment makes them train.
#include <ampp/amp/opt_level.h>
#include <ampp/amp/properties.h>
#include <ampp/dist/launcher.h>
#include <ampp/dist/log.h>
#include <ampp/precision/dtype.h>
#include <ampp/precision/float8.h>
#include <ampp/train/dataset.h>
#include <ampp/train/trainer.h>
#include <ampp/util/atomic_file.h>
#include <ampp/util/launch_environment.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "command_registry.h"
#include "layout_choice.h"

namespace {

using ampp::train::TrainOptions;

constexpr int kAutoNproc = 0;  // --nproc auto: the fastest measured layout (layout_choice.h)

struct TrainArgs {
  TrainOptions options;
  std::optional<ampp::Float8Recipe> fp8_recipe;  // --fp8-recipe, applied to --dtype fp8 in run()
  int nproc = kAutoNproc;
  double stall_timeout_s = ampp::dist::LaunchOptions().stall_timeout().count() / 1000.0;
};

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  TORCH_CHECK(n > 0, "cannot find the ampp executable (/proc/self/exe) to start the workers");
  return std::string(buf, static_cast<size_t>(n));
}

// --dtype: bf16 or fp16, or fp8: bf16 with the GPT's Linear products in float8 (TrainOptions::fp8).
void set_dtype(TrainOptions& o, const std::string& text) {
  if (text != "fp8") {
    for (const char* name : {"bf16", "bfloat16", "fp16", "float16", "half"})
      if (text == name) {
        o.dtype(ampp::parse_low_precision_dtype(text, "the value")).fp8(std::nullopt);
        return;
      }
    TORCH_CHECK(false, "the value '", text, "' is not a low-precision dtype; use bf16, fp16 or fp8");
  }
  o.dtype(c10::kBFloat16).fp8(ampp::Float8Recipe::kTensorwise);
}

void add_fp8_flags(CLI::App& sub, TrainArgs& a) {
  sub.add_option_function<std::string>(
         "--fp8-recipe", [&a](const std::string& text) { a.fp8_recipe = ampp::parse_float8_recipe(text); },
         "with --dtype fp8: torchao's tensorwise (one scale per tensor, e5m2 gradients) or rowwise (per row, "
         "power-of-2 scales), or TransformerEngine's delayed (scales from an amax history)")
      ->check(ampp::cli::parsed_by(ampp::parse_float8_recipe, "RECIPE"))
      ->default_str("tensorwise");
  sub.add_option_function<std::string>(
         "--fp8-layers",
         [&a](const std::string& text) {
           TORCH_CHECK(text == "auto" || text == "all", "--fp8-layers '", text, "': use auto or all");
           a.options.fp8_all_layers(text == "all");
         },
         "with --dtype fp8: auto (the shapes where fp8 pays, torchao's filter) or all (every Linear whose sizes "
         "are multiples of 16)")
      ->default_str("auto");
  ampp::cli::add_number(sub, "--fp8-amax-history", a.options.fp8_amax_history(),
                        "with --fp8-recipe delayed: the passes each scale is computed from");
}

void add_precision_flags(CLI::App& sub, TrainOptions& o) {
  sub.add_option_function<std::string>(
         "--opt-level", [&o](const std::string& text) { o.opt_level(ampp::parse_opt_level(text)); },
         "apex opt level: O0 (fp32), O1 (autocast), O2 (fp32 masters), O3")
      ->check(ampp::cli::parsed_by(ampp::parse_opt_level, "OPT_LEVEL"))
      ->default_str(ampp::to_string(o.opt_level()));
  auto parse_dtype = [](const std::string& text) {
    TrainOptions scratch;
    set_dtype(scratch, text);
  };
  sub.add_option_function<std::string>(
         "--dtype", [&o](const std::string& text) { set_dtype(o, text); },
         "low-precision type: bf16, fp16 (emulated on CPU), or fp8 (a GPT's Linear products in float8, the rest "
         "bf16)")
      ->check(ampp::cli::parsed_by(parse_dtype, "DTYPE"))
      ->default_str(ampp::low_precision_dtype_name(o.dtype()));
  auto parse_loss_scale = [](const std::string& text) { return ampp::LossScale(text); };
  sub.add_option_function<std::string>(
         "--loss-scale", [&o, parse_loss_scale](const std::string& text) { o.loss_scale(parse_loss_scale(text)); },
         "'dynamic' or a static number (default: the opt level's)")
      ->check(ampp::cli::parsed_by(parse_loss_scale, "LOSS_SCALE"));
}

void add_optimization_flags(CLI::App& sub, TrainOptions& o) {
  ampp::cli::add_number(sub, "--batch-size", o.batch_size(), "global batch size, split across workers");
  ampp::cli::add_number(sub, "--epochs", o.epochs(), "training epochs (in total, also when resuming)");
  ampp::cli::add_number(sub, "--steps", o.steps(), "stop after this many steps in total (0: no limit)");
  sub.add_option_function<std::string>(
         "--optimizer", [&o](const std::string& text) { o.optimizer(ampp::train::parse_optimizer_kind(text)); },
         "sgd (with --momentum) or adamw (nanoGPT's: betas 0.9, 0.95; no weight decay on biases and norms)")
      ->check(ampp::cli::parsed_by(ampp::train::parse_optimizer_kind, "OPTIMIZER"))
      ->default_str("sgd; a GPT: adamw");
  ampp::cli::add_number(sub, "--lr", o.lr(), "learning rate (the peak, with warmup or a cosine schedule)",
                        "sgd 0.05, adamw 6e-4");
  ampp::cli::add_number(sub, "--momentum", o.momentum(), "SGD momentum");
  ampp::cli::add_number(sub, "--weight-decay", o.weight_decay(), "weight decay (AdamW's decoupled)",
                        "sgd 1e-4, adamw 0.1");
  sub.add_option_function<std::string>(
         "--lr-schedule", [&o](const std::string& text) { o.lr_schedule(ampp::train::parse_lr_schedule(text)); },
         "step (StepLR: --lr-step, --lr-gamma) or cosine (nanoGPT's: down to lr/10 over --lr-decay-steps)")
      ->check(ampp::cli::parsed_by(ampp::train::parse_lr_schedule, "SCHEDULE"))
      ->default_str("step; a GPT: cosine");
  ampp::cli::add_number(sub, "--lr-step", o.lr_step(), "StepLR step size in epochs (0: constant lr)");
  ampp::cli::add_number(sub, "--lr-gamma", o.lr_gamma(), "StepLR factor");
  ampp::cli::add_number(sub, "--lr-decay-steps", o.lr_decay_steps(),
                        "cosine: optimizer steps after the warmup to reach lr/10 (0: the run's last step)");
  ampp::cli::add_number(sub, "--warmup-steps", o.warmup_steps(),
                        "linear lr warmup over this many optimizer steps taken (skipped steps do not count; 0: off)");
  ampp::cli::add_number(sub, "--grad-accum", o.grad_accum(),
                        "run each step's batch as this many equal micro-batches, gradients accumulated (less memory; "
                        "nanoGPT's gradient_accumulation_steps at the same --batch-size)");
  ampp::cli::add_number(sub, "--clip-grad-norm", o.clip_grad_norm(),
                        "clip the (unscaled) gradient norm to this (0: off)", "0; a GPT: 1");
  ampp::cli::add_number(sub, "--seed", o.seed(), "seed for weights, data order and synthetic data");
  sub.add_flag("--deterministic", o.deterministic(), "deterministic algorithms only");
  sub.add_flag("--sync-bn", o.sync_batch_norm(),
               "BatchNorm statistics over the global batch of all workers (SyncBatchNorm), not each worker's share");
  sub.add_flag_callback(
      "--gloo-allreduce", [&o] { o.shared_memory_allreduce(false); },
      "workers reduce gradients and broadcast buffers all through Gloo's TCP, instead of through shared memory among "
      "the workers of each machine (and Gloo only between machines)");
  sub.add_flag_callback(
      "--no-cudnn-benchmark", [&o] { o.cudnn_benchmark(false); },
      "on a GPU: cuDNN's default convolution algorithms instead of the fastest measured ones");
  sub.add_flag_callback(
      "--no-fused-optimizer", [&o] { o.fused_optimizer(false); },
      "on a GPU: torch::optim::SGD or AdamW instead of ampp::FusedSGD or FusedAdamW (the same update in one kernel)");
  sub.add_flag_callback(
      "--fused-optimizer", [&o] { o.fused_optimizer(true); },
      "ampp::FusedSGD or FusedAdamW on the CPU too (the default on a GPU), which skip an overflowed step themselves");
  sub.add_option_function<std::string>(
         "--host-reads", [&o](const std::string& text) { o.host_reads(ampp::train::parse_host_reads(text)); },
         "where the host reads the steps' results: auto (every step on the CPU, at log points on a GPU), every-step, "
         "or log-points (on the CPU: as a GPU run reads)")
      ->check(ampp::cli::parsed_by(ampp::train::parse_host_reads, "WHERE"))
      ->default_str("auto");
  sub.add_flag_callback(
      "--no-pinned-batches", [&o] { o.pinned_batches(false); },
      "on a GPU: copy batches from pageable memory, blocking, instead of from pinned memory");
  sub.add_flag_callback(
      "--no-prefetch", [&o] { o.prefetch_batches(false); },
      "on a GPU: prepare and copy each batch when the step needs it, instead of one ahead on a loader thread and "
      "a side stream while the step before runs");
  sub.add_flag_callback(
      "--prefetch", [&o] { o.prefetch_batches(true); },
      "the loader thread on the CPU too (the default on a GPU); the same batches, one core less for the step");
  sub.add_flag("--cuda-graphs", o.cuda_graphs(),
               "on a GPU, one worker: each step one CUDA graph replay, nothing waiting for the host; the loss and "
               "accuracy read every --log-every steps (O0/O1; docs/gpu.md)");
  sub.add_flag_callback(
      "--nchw", [&o] { o.channels_last(false); },
      "keep cnn and resnet activations in NCHW order instead of channels-last (slower CPU kernels; for comparison)");
  sub.add_flag("--zero", o.zero(),
               "shard the optimizer state over the workers (ZeRO stage 1, ZeroRedundancyOptimizer); same results");
  sub.add_flag("--fsdp", o.fsdp(),
               "fully sharded data parallel instead of DDP: each worker keeps 1/N of the parameters, gradients and "
               "momentum, and gathers the model's blocks one at a time (O0/O1; docs/distributed.md)");
  ampp::cli::add_number(sub, "--max-consecutive-skips", o.max_consecutive_skips(),
                        "stop with an error after this many steps in a row skipped for inf/NaN gradients (0: never)");
}

void add_run_flags(CLI::App& sub, TrainArgs& a) {
  TrainOptions& o = a.options;
  sub.add_option("--model", o.model(), "mlp, cnn (with BatchNorm), resnet, or a GPT: gpt-tiny, gpt-mini, gpt2-124m")
      ->capture_default_str();
  sub.add_option("--data", o.data(),
                 "images: Fashion-MNIST from dataset-fashion-mnist (default), 'synthetic[:N]' or an MNIST-format "
                 "folder; text (GPTs): 'text' (Debian's fortunes, the default) or 'text:FILE' (a file or folder)");
  sub.add_option("--device", o.device(),
                 "cpu, cuda or cuda:N: where the model and its batches live (a GPU takes one worker; docs/gpu.md)")
      ->capture_default_str();
  ampp::cli::add_number(sub, "--context", o.context(), "GPT: tokens per sequence (0: the preset's)");
  ampp::cli::add_number(sub, "--n-layer", o.n_layer(), "GPT: blocks (0: the preset's)");
  ampp::cli::add_number(sub, "--n-head", o.n_head(), "GPT: attention heads (0: the preset's)");
  ampp::cli::add_number(sub, "--n-embd", o.n_embd(), "GPT: width, a multiple of --n-head (0: the preset's)");
  ampp::cli::add_number(sub, "--num-classes", o.num_classes(), "number of classes (0: from the labels)");
  sub.add_flag_callback(
      "--data-in-memory", [&o] { o.map_data(false); },
      "read the images into each worker's memory instead of mapping one copy the machine's workers share");
  auto parse_nproc = [](const std::string& text) {
    if (text == "auto") return kAutoNproc;
    const auto n = ampp::cli::parse_as<int>(text);
    TORCH_CHECK(n && *n >= 1 && *n <= 256, "'", text, "' is not auto or a number of workers from 1 to 256");
    return *n;
  };
  sub.add_option_function<std::string>(
         "--nproc", [&a, parse_nproc](const std::string& text) { a.nproc = parse_nproc(text); },
         "worker processes (DDP + DistributedSampler through the launcher); auto: the fastest layout of workers x "
         "threads for this job on this machine, measured once and cached")
      ->check(ampp::cli::parsed_by(parse_nproc, "N|auto"))
      ->type_name("N|auto")
      ->default_str(a.nproc == kAutoNproc ? "auto" : std::to_string(a.nproc));
  ampp::cli::add_number(sub, "--stall-timeout", a.stall_timeout_s,
                        "seconds a worker may make no progress before it is named and the run stopped (0: off)");
  ampp::cli::add_number(sub, "--timeout", o.timeout(),
                        "seconds a collective or the rendezvous may wait for another worker");
  ampp::cli::add_number(sub, "--threads", o.threads(), "intra-op threads per worker (0: cores / workers)");
  sub.add_option("--checkpoint-dir", o.checkpoint_dir(), "write checkpoints here (every epoch)");
  ampp::cli::add_number(sub, "--checkpoint-every", o.checkpoint_every(),
                        "also checkpoint every N steps (0: per epoch only)");
  sub.add_flag("--resume", o.resume(), "continue from --checkpoint-dir's checkpoint");
  sub.add_option("--resume-from", o.resume_from(),
                 "continue from a PyTorch-format checkpoint (torch.save of {model, optimizer, scaler, epoch, step} "
                 "or of a model state_dict) when --checkpoint-dir has none of its own");
  sub.add_option("--out", o.out(), "folder for metrics.jsonl, summary.json, model.pt and plots")->capture_default_str();
  ampp::cli::add_number(sub, "--log-every", o.log_every(),
                        "a metrics.jsonl step line every N steps (and for every skipped step)");
  sub.add_flag_callback("--no-plots", [&o] { o.plots(false); }, "do not run gnuplot");
  sub.add_flag("--doctor", o.doctor(),
               "numerics doctor: record gradient ranges every step, write doctor.json and doctor_gradients.png");
  sub.add_option("--tensorboard", o.tensorboard(),
                 "also write the metrics (and the doctor's histograms) as TensorBoard event files into DIR");
  sub.add_flag_callback("--quiet", [&o] { o.progress(false); }, "no progress output");
  sub.add_flag("--profile", o.profile(),
               "print where each worker's step time went: data, forward, backward, allreduce wait, optimizer, "
               "bookkeeping (summary.json has it always), and rank 0's memory by kind: weights, masters, gradients, "
               "optimizer state, data, activations (counts every tensor; summary.json memory_bytes)");
}

// Launcher mode: this process starts `nproc` workers running the user's own command line.
int launch_workers(const TrainArgs& a) {
  const TrainOptions& o = a.options;
  TORCH_CHECK(o.batch_size() >= a.nproc, "--batch-size ", o.batch_size(), " is smaller than --nproc ", a.nproc,
              "; each worker needs at least one image per batch");
  // A missing dataset fails here, once, rather than in every worker.
  if (ampp::train::dataset_name(o.data()) == "fashion-mnist")
    TORCH_CHECK(std::filesystem::is_directory(ampp::train::kFashionMnistDir), "Fashion-MNIST not found in ",
                ampp::train::kFashionMnistDir, ": install it with `sudo apt install dataset-fashion-mnist`, or pass ",
                "--data DIR (an MNIST-format folder) or --data synthetic");
  // Unusable output folders fail here too, once, before the workers load any data.
  ampp::check_writable_folder(o.out(), "TrainOptions::out");
  if (!o.checkpoint_dir().empty()) ampp::check_writable_folder(o.checkpoint_dir(), "TrainOptions::checkpoint_dir");
  if (!o.tensorboard().empty()) ampp::check_writable_folder(o.tensorboard(), "TrainOptions::tensorboard");
  // Idle OpenMP threads sleep instead of spinning against the other worker (notes: ~1.6x on fp32).
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
  std::vector<std::string> argv{self_exe()};
  const auto& args = ampp::cli::original_args();
  argv.insert(argv.end(), args.begin(), args.end());
  const auto stall_timeout = std::chrono::milliseconds(static_cast<long long>(a.stall_timeout_s * 1000));
  return ampp::dist::launch(
      ampp::dist::LaunchOptions().nproc_per_node(a.nproc).stall_timeout(stall_timeout).verbose(false), argv);
}

// --nproc auto in the launching process: the layout chosen, and why, on the terminal.
int chosen_nproc(const TrainOptions& o) {
  const auto choice = ampp::cli::choose_layout(o, self_exe(), ampp::cli::default_layout_cache());
  if (o.progress()) std::printf("ampp train: %s\n", choice.reason.c_str());
  std::fflush(stdout);
  return choice.nproc;
}

int run(TrainArgs a) {
  TORCH_CHECK(a.stall_timeout_s >= 0 && a.stall_timeout_s <= 1e6,
              "--stall-timeout must be 0 (off) to 1e6 seconds, got ", a.stall_timeout_s);
  if (a.fp8_recipe) {
    TORCH_CHECK(a.options.fp8(), "--fp8-recipe chooses the recipe of --dtype fp8; add --dtype fp8");
    a.options.fp8(*a.fp8_recipe);
  }
  ampp::train::validate(a.options);
  const bool launching = !ampp::launch_environment().launched();  // not a worker of a launcher or torchrun
  if (a.nproc == kAutoNproc) a.nproc = launching ? chosen_nproc(a.options) : 1;
  if (a.nproc > 1 && launching) return launch_workers(a);
  // The progress bar already says what the workers do: the library's setup lines (process group
  // ready, DDP buckets) are shown only when asked for with AMPP_LOG_LEVEL=info or debug.
  if (!std::getenv("AMPP_LOG_LEVEL")) ampp::dist::set_log_level(ampp::dist::LogLevel::kWarning);
  ampp::train::train(a.options);
  return 0;
}

std::function<int()> add_train_flags(CLI::App& sub, std::shared_ptr<TrainArgs> a) {
  add_run_flags(sub, *a);
  add_precision_flags(sub, a->options);
  add_fp8_flags(sub, *a);
  add_optimization_flags(sub, a->options);
  return [a] { return run(*a); };
}

const std::map<std::string, std::string> kTrainRenamedFields = {
    {"progress", "--quiet"},
    {"fp8", "--dtype fp8"},
    {"fp8_all_layers", "--fp8-layers all"},
    {"plots", "--no-plots"},
    {"sync_batch_norm", "--sync-bn"},
    {"shared_memory_allreduce", "--gloo-allreduce"},
    {"channels_last", "--nchw"},
    {"map_data", "--data-in-memory"},
    {"cudnn_benchmark", "--no-cudnn-benchmark"},
    {"fused_optimizer", "--fused-optimizer / --no-fused-optimizer"},
    {"pinned_batches", "--no-pinned-batches"},
    {"prefetch_batches", "--prefetch / --no-prefetch"}};

const bool registered_train = ampp::cli::register_command(
    {"train", "Train a model (Fashion-MNIST by default) with mixed precision and data-parallel workers",
     [](CLI::App& sub) { return add_train_flags(sub, std::make_shared<TrainArgs>()); }, kTrainRenamedFields});

// `ampp doctor`: a short `ampp train` run with the numerics doctor on, which diagnoses instead of
// stopping at a divergence. The defaults are set before the flags, so --help shows them.
const bool registered_doctor = ampp::cli::register_command(
    {"doctor",
     "Run a few steps of an `ampp train` configuration and report the gradients' fp16/bf16 ranges "
     "(doctor.json, doctor_gradients.png) with a recommendation",
     [](CLI::App& sub) {
       auto a = std::make_shared<TrainArgs>();
       a->options.doctor(true).steps(100).out("ampp-doctor-out").max_consecutive_skips(0);
       a->nproc = 2;  // a diagnosis, not a speed question: two workers, as the doctor always used
       return add_train_flags(sub, a);
     },
     kTrainRenamedFields});

}  // namespace
