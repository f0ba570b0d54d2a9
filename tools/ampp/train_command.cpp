// `ampp train`: train a model on Fashion-MNIST (or any MNIST-format folder, or synthetic data)
// with mixed precision and data-parallel workers. See docs/training.md.
//   ampp train                          # defaults: see docs/training.md (2 workers, O1 fp16, dynamic scaling)
//   ampp train --opt-level O2 --dtype bf16 --model resnet --epochs 5 --nproc 1
#include <ampp/dist/launcher.h>
#include <ampp/dist/log.h>
#include <ampp/train/dataset.h>
#include <ampp/train/models.h>
#include <ampp/train/trainer.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "command_registry.h"

namespace {

struct TrainArgs {
  ampp::train::TrainOptions options;
  std::string dtype = "fp16";
  std::string model = options.model(), data, opt_level = options.opt_level(), loss_scale, checkpoint_dir,
              out = options.out();
  int nproc = 2;
  int64_t seed = 0;
};

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  TORCH_CHECK(n > 0, "cannot find the ampp executable (/proc/self/exe) to start the workers");
  return std::string(buf, static_cast<size_t>(n));
}

// The worker command line: the same options, spelled out (workers see WORLD_SIZE and train).
std::vector<std::string> worker_argv(const TrainArgs& a) {
  const auto& o = a.options;
  std::vector<std::string> argv{self_exe(), "train",
                                "--model", o.model(), "--opt-level", o.opt_level(), "--dtype", a.dtype,
                                "--batch-size", std::to_string(o.batch_size()), "--epochs", std::to_string(o.epochs()),
                                "--steps", std::to_string(o.steps()), "--lr", fmt::format("{}", o.lr()),
                                "--momentum", fmt::format("{}", o.momentum()),
                                "--weight-decay", fmt::format("{}", o.weight_decay()),
                                "--lr-step", std::to_string(o.lr_step()), "--lr-gamma", fmt::format("{}", o.lr_gamma()),
                                "--clip-grad-norm", fmt::format("{}", o.clip_grad_norm()),
                                "--seed", std::to_string(a.seed), "--threads", std::to_string(o.threads()),
                                "--checkpoint-every", std::to_string(o.checkpoint_every()), "--out", o.out(),
                                "--log-every", std::to_string(o.log_every()), "--nproc", std::to_string(a.nproc)};
  if (!o.data().empty()) argv.insert(argv.end(), {"--data", o.data()});
  if (!o.loss_scale().empty()) argv.insert(argv.end(), {"--loss-scale", o.loss_scale()});
  if (!o.checkpoint_dir().empty()) argv.insert(argv.end(), {"--checkpoint-dir", o.checkpoint_dir()});
  if (o.deterministic()) argv.push_back("--deterministic");
  if (o.resume()) argv.push_back("--resume");
  if (!o.plots()) argv.push_back("--no-plots");
  if (!o.progress()) argv.push_back("--quiet");
  return argv;
}

int run(TrainArgs& a) {
  auto& o = a.options;
  TORCH_CHECK(a.dtype == "fp16" || a.dtype == "bf16", "--dtype '", a.dtype, "' is invalid; use bf16 or fp16");
  o.dtype(a.dtype == "fp16" ? c10::kHalf : c10::kBFloat16);
  TORCH_CHECK(a.seed >= 0, "--seed must be a non-negative integer");
  o.seed(static_cast<uint64_t>(a.seed));
  TORCH_CHECK(a.nproc >= 1 && a.nproc <= 256, "--nproc must be between 1 and 256, got ", a.nproc);
  ampp::train::validate(o);
  const char* world = std::getenv("WORLD_SIZE");
  if (a.nproc > 1 && (world == nullptr || *world == '\0')) {
    // Launcher mode: re-execute this program as nproc workers (torchrun-style environment).
    TORCH_CHECK(o.batch_size() >= a.nproc, "--batch-size ", o.batch_size(), " is smaller than --nproc ", a.nproc,
                "; each worker needs at least one image per batch");
    // A missing dataset fails here, once, rather than in every worker.
    if (o.data().empty() || o.data() == "fashion-mnist")
      TORCH_CHECK(std::filesystem::is_directory(ampp::train::kFashionMnistDir), "Fashion-MNIST not found in ",
                  ampp::train::kFashionMnistDir, ": install it with `sudo apt install dataset-fashion-mnist`, or pass ",
                  "--data DIR (an MNIST-format folder) or --data synthetic");
    // Idle OpenMP threads sleep instead of spinning against the other worker (notes: ~1.6x on fp32).
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
    ampp::dist::LaunchOptions launch;
    launch.nproc_per_node(a.nproc).verbose(false);
    return ampp::dist::launch(launch, worker_argv(a));
  }
  // The progress bar already says what the workers do: the library's setup lines (process group
  // ready, DDP buckets) are shown only when asked for with AMPP_LOG_LEVEL=info or debug.
  if (!std::getenv("AMPP_LOG_LEVEL")) ampp::dist::set_log_level(ampp::dist::LogLevel::Warning);
  ampp::train::train(o);
  return 0;
}

const bool registered = ampp::cli::register_command(
    {"train", "Train a model (Fashion-MNIST by default) with mixed precision and data-parallel workers",
     [](CLI::App& sub) -> std::function<int()> {
       auto a = std::make_shared<TrainArgs>();
       auto& o = a->options;
       sub.add_option("--model", a->model, "mlp, cnn (with BatchNorm) or resnet")->capture_default_str();
       sub.add_option("--data", a->data,
                      "Fashion-MNIST from dataset-fashion-mnist (default), 'synthetic[:N]' or an MNIST-format folder");
       sub.add_option("--opt-level", a->opt_level, "apex opt level: O0 (fp32), O1 (autocast), O2 (fp32 masters), O3")
           ->capture_default_str();
       sub.add_option("--dtype", a->dtype, "low-precision type: bf16 or fp16 (emulated on CPU)")->capture_default_str();
       sub.add_option("--loss-scale", a->loss_scale, "'dynamic' or a static number (default: the opt level's)");
       sub.add_option("--nproc", a->nproc, "worker processes (DDP + DistributedSampler through the launcher)")
           ->capture_default_str();
       auto int_option = [&](const char* name, auto setter, int64_t def, const char* help) {
         sub.add_option(name, [setter](const CLI::results_t& r) { setter(std::stoll(r[0])); return true; }, help)
             ->default_str(std::to_string(def))
             ->check(CLI::TypeValidator<int64_t>());
       };
       auto real_option = [&](const char* name, auto setter, double def, const char* help) {
         sub.add_option(name, [setter](const CLI::results_t& r) { setter(std::stod(r[0])); return true; }, help)
             ->default_str(fmt::format("{}", def))
             ->check(CLI::TypeValidator<double>());
       };
       int_option("--batch-size", [&o](int64_t v) { o.batch_size(v); }, o.batch_size(),
                  "global batch size, split across workers");
       int_option("--epochs", [&o](int64_t v) { o.epochs(v); }, o.epochs(), "training epochs (in total, also when resuming)");
       int_option("--steps", [&o](int64_t v) { o.steps(v); }, o.steps(), "stop after this many steps in total (0: no limit)");
       real_option("--lr", [&o](double v) { o.lr(v); }, o.lr(), "SGD learning rate");
       real_option("--momentum", [&o](double v) { o.momentum(v); }, o.momentum(), "SGD momentum");
       real_option("--weight-decay", [&o](double v) { o.weight_decay(v); }, o.weight_decay(), "SGD weight decay");
       int_option("--lr-step", [&o](int64_t v) { o.lr_step(v); }, o.lr_step(), "StepLR step size in epochs (0: constant lr)");
       real_option("--lr-gamma", [&o](double v) { o.lr_gamma(v); }, o.lr_gamma(), "StepLR factor");
       real_option("--clip-grad-norm", [&o](double v) { o.clip_grad_norm(v); }, o.clip_grad_norm(),
                   "clip the (unscaled) gradient norm to this (0: off)");
       sub.add_option("--seed", a->seed, "seed for weights, data order and synthetic data")->capture_default_str();
       sub.add_flag_callback("--deterministic", [&o] { o.deterministic(true); }, "deterministic algorithms only");
       int_option("--threads", [&o](int64_t v) { o.threads(static_cast<int>(v)); }, 0,
                  "intra-op threads per worker (0: cores / workers)");
       sub.add_option("--checkpoint-dir", a->checkpoint_dir, "write checkpoints here (every epoch)");
       int_option("--checkpoint-every", [&o](int64_t v) { o.checkpoint_every(v); }, 0,
                  "also checkpoint every N steps (0: per epoch only)");
       sub.add_flag_callback("--resume", [&o] { o.resume(true); }, "continue from --checkpoint-dir's checkpoint");
       sub.add_option("--out", a->out, "folder for metrics.jsonl, summary.json, model.pt and plots")->capture_default_str();
       int_option("--log-every", [&o](int64_t v) { o.log_every(v); }, o.log_every(),
                  "a metrics.jsonl step line every N steps (and for every skipped step)");
       sub.add_flag_callback("--no-plots", [&o] { o.plots(false); }, "do not run gnuplot");
       sub.add_flag_callback("--quiet", [&o] { o.progress(false); }, "no progress output");
       return [a] {
         auto& o = a->options;
         o.model(a->model).data(a->data).opt_level(a->opt_level).loss_scale(a->loss_scale);
         o.checkpoint_dir(a->checkpoint_dir).out(a->out);
         try {
           return run(*a);
         } catch (const c10::Error& e) {
           throw std::runtime_error(e.what_without_backtrace());  // the message, not LibTorch's backtrace
         }
       };
     }});

}  // namespace
