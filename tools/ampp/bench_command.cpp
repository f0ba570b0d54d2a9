// `ampp bench`: a quick, same-run comparison a user can run on their own machine:
//   1. training step time of each opt level (O0 = FP32 baseline) on the reference models, with the
//      share of the step spent in ampp's own machinery (scaler, casts, master copies);
//   2. the fused gradient unscale + inf/NaN check against one flat copy of the same bytes (the memory
//      bandwidth limit) and against the naive per-tensor isfinite().all() + mul_.
// On the CPU by default, or on a GPU with --device cuda: there the optimizer is ampp::FusedSGD (as in
// `ampp train`), and each timing is a round of queued work between two CUDA events, divided by its
// length, so that a wait per step does not count as step time.
// Every number is a ratio to a baseline measured in the same run: absolute times on a shared
// machine drift by tens of percent, ratios much less. The full Google Benchmark suites are in bench/.
#include "command_registry.h"
#include "torch_compat.h"

#include <ampp/amp/initialize.h>
#include <ampp/numerics/unscale.h>
#include <ampp/precision/dtype.h>
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/train/allocator.h>
#include <ampp/train/models.h>
#include <ampp/train/options.h>
#include <ampp/util/threads.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <fmt/core.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace {

struct BenchOptions {
  std::vector<std::string> models{"mlp", "cnn"};
  std::vector<std::string> levels{"O0", "O1", "O2", "O3"};
  std::string dtype = "bf16";
  std::string loss_scale;  // empty: each opt level's default
  int64_t batch_size = 256;
  int steps = 10;
  int threads = 0;
  int64_t unscale_mib = 64;
  std::string device = "cpu";  // or cuda / cuda:N
};

// Waits for the device's queued work, so that a timing covers it (a no-op on the CPU).
void wait_for(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

// Seconds per call of `body` over a round of `per_round` calls: on a GPU between two CUDA events recorded
// around the round on the current stream (the GPU's own clock; the host waits once, at the end), on the
// CPU by the host's clock.
double round_seconds(const std::function<void()>& body, const torch::Device& device, int per_round) {
#if AMPP_HAS_EVENT_ELAPSED_TIME
  if (device.is_cuda()) {
    const c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
    const c10::Stream stream = cuda.getStream(cuda.getDevice());
    c10::Event start(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    c10::Event end(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    start.record(stream);
    for (int k = 0; k < per_round; ++k) body();
    end.record(stream);
    end.synchronize();
    return start.elapsedTime(end) / 1e3 / per_round;  // milliseconds
  }
#endif
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < per_round; ++k) body();
  wait_for(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / per_round;
}

// The median over `repeats` rounds of the seconds per call of `body` (round_seconds).
double median_seconds(int repeats, const std::function<void()>& body, const torch::Device& device, int per_round = 1) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) times.push_back(round_seconds(body, device, per_round));
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

struct OptLevelTiming {
  double step_seconds;     // median of the timed steps
  ampp::AmpProfile spent;  // ampp's own work over the timed steps (Properties::profile)
  int64_t steps;
  double per_step_us(double seconds) const { return seconds / steps * 1e6; }
  double machinery_share() const { return spent.total_seconds() / steps / step_seconds; }
};

// Median seconds per training step of `model_name` at `level`, and where ampp's own time went.
OptLevelTiming time_opt_level(const std::string& model_name, const std::string& level, const BenchOptions& options,
                              const torch::Device& device) {
  torch::manual_seed(0);
  auto model = ampp::train::make_model(model_name);
  model->to(device);
  // On a GPU the fused SGD `ampp train` uses: the overflow skip stays on the device (no host read).
  std::unique_ptr<torch::optim::Optimizer> optimizer_holder;
  const auto sgd = torch::optim::SGDOptions(0.01).momentum(0.9);
  if (device.is_cuda())
    optimizer_holder = std::make_unique<ampp::FusedSGD>(model->parameters(), sgd);
  else
    optimizer_holder = std::make_unique<torch::optim::SGD>(model->parameters(), sgd);
  auto& optimizer = *optimizer_holder;
  const auto dtype = ampp::parse_low_precision_dtype(options.dtype, "--dtype");
  ampp::Properties props(level);
  props.dtype(dtype).profile(true).verbosity(0);
  if (!options.loss_scale.empty() && level != "O0") props.loss_scale(ampp::LossScale(options.loss_scale));
  auto amp = ampp::initialize(model, optimizer, props);
  auto images = torch::randn({options.batch_size, 1, 28, 28}).to(device);
  auto labels = torch::randint(10, {options.batch_size}, torch::kLong).to(device);
  auto step = [&] {
    amp.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(amp.forward(model, images), labels);
    amp.scale_loss(loss).backward();
    amp.step();
  };
  step();  // warm-up: kernel selection, allocator, lazy registrations
  wait_for(device);
  const auto before = amp.profile();
  const int per_round = device.is_cuda() ? 10 : 1;
  double seconds = median_seconds(options.steps, step, device, per_round);
  const auto after = amp.profile();
  ampp::AmpProfile spent;
  spent.scaler_seconds = after.scaler_seconds - before.scaler_seconds;
  spent.copy_seconds = after.copy_seconds - before.copy_seconds;
  spent.cast_seconds = after.cast_seconds - before.cast_seconds;
  return {seconds, spent, static_cast<int64_t>(options.steps) * per_round};
}

// 64 tensors, options.unscale_mib MiB of fp32 gradients in all, against one flat copy of the same bytes.
void print_unscale_bench(const BenchOptions& options, const torch::Device& device) {
  const int64_t count = 64, per_tensor = options.unscale_mib * (1 << 20) / 4 / count, values = count * per_tensor;
  std::vector<torch::Tensor> grads;
  for (int64_t i = 0; i < count; ++i) grads.push_back(torch::rand({per_tensor}).to(device));
  const auto flat_source = torch::rand({values}).to(device);
  auto flat = torch::empty_like(flat_source);
  auto found_inf = torch::zeros({1}).to(device);
  auto inv_scale = torch::full({1}, 0.5f).to(device);
  // Bytes each pass moves: a copy reads and writes every value; the fused path does too, and on a GPU
  // reads them once more (ATen's kernel checks the values before unscaling, ampp's second pass after: unscale.h).
  const double copy_bytes = 2.0 * static_cast<double>(values) * 4, passes = device.is_cuda() ? 1.5 : 1.0;
  const int per_round = device.is_cuda() ? 20 : 1;
  const double fused = median_seconds(
      5, [&] { ampp::numerics::non_finite_check_and_unscale_(grads, found_inf, inv_scale); }, device, per_round);
  const double copy = median_seconds(5, [&] { flat.copy_(flat_source); }, device, per_round);
  const double naive = median_seconds(
      3,
      [&] {
        for (auto& g : grads) {
          if (!torch::isfinite(g).all().item<bool>()) found_inf.fill_(1);
          g.mul_(0.5);
        }
      },
      device);
  fmt::print("\nunscale + inf/NaN check, {} tensors, {} MiB fp32:\n", count, options.unscale_mib);
  fmt::print("  one flat copy of the same bytes (bandwidth limit) {:8.2f} GB/s\n", copy_bytes / copy / 1e9);
  fmt::print("  ampp fused kernel ({:>7}): {:.1f}x the bytes      {:8.2f} GB/s moved, {:.2f}x the copy's time\n",
             ampp::numerics::unscale_kernel_variant(), passes, passes * copy_bytes / fused / 1e9, fused / copy);
  fmt::print("  naive isfinite().all() + mul_                    {:8.2f} GB/s  (fused is {:.1f}x faster)\n",
             copy_bytes / naive / 1e9, naive / fused);
}

int run_bench(const BenchOptions& options) {
  const torch::Device device = ampp::train::usable_device(options.device, "--device");
  ampp::train::retain_freed_memory();  // as `ampp train` does, so steps are timed as they train
  ampp::set_compute_threads(options.threads > 0 ? options.threads : at::get_num_threads());
  fmt::print("ampp bench on {}: {} intra-op threads, batch {}, low precision {}, loss scale {}, median of {} steps\n\n",
             device.str(), at::get_num_threads(), options.batch_size, options.dtype,
             options.loss_scale.empty() ? "per opt level" : options.loss_scale, options.steps);
  fmt::print("{:<6} {:<4} {:>12} {:>10} {:>16}   {}\n", "model", "opt", "step (ms)", "vs O0", "ampp machinery",
             "of which, us/step: scaler  copies  casts");
  for (const auto& model : options.models) {
    double baseline = 0;
    for (const auto& level : options.levels) {
      const OptLevelTiming t = time_opt_level(model, level, options, device);
      if (level == options.levels.front()) baseline = t.step_seconds;
      fmt::print("{:<6} {:<4} {:>12.2f} {:>9.2f}x {:>15.1f}%   {:>24.0f} {:>7.0f} {:>6.0f}\n", model, level,
                 t.step_seconds * 1e3, t.step_seconds / baseline, t.machinery_share() * 100,
                 t.per_step_us(t.spent.scaler_seconds), t.per_step_us(t.spent.copy_seconds),
                 t.per_step_us(t.spent.cast_seconds));
    }
  }

  print_unscale_bench(options, device);
  return 0;
}

[[maybe_unused]] const bool registered_bench = ampp::cli::register_command(
    {"bench", "Quick same-run benchmark: opt levels vs FP32, fused unscale vs memory bandwidth",
     [](CLI::App& sub) -> std::function<int()> {
       auto options = std::make_shared<BenchOptions>();
       sub.add_option("--models", options->models, "reference models")->check(CLI::IsMember({"mlp", "cnn", "resnet"}));
       sub.add_option("--opt-levels", options->levels, "opt levels; the first is the baseline")
           ->check(ampp::cli::parsed_by(ampp::parse_opt_level, "OPT_LEVEL"));
       sub.add_option("--dtype", options->dtype, "low-precision type")
           ->check(ampp::cli::parsed_by(
               [](const std::string& text) { return ampp::parse_low_precision_dtype(text, "the value"); }, "DTYPE"));
       sub.add_option("--loss-scale", options->loss_scale,
                      "dynamic or a number for O1-O3 (default: the opt level's); 1 drops the scaler, as bf16 allows")
           ->check([](const std::string& v) {
             try {
               ampp::LossScale{v};
               return std::string();
             } catch (const std::exception&) {
               return "'" + v + "' is not \"dynamic\" or a number > 0";
             }
           });
       sub.add_option("--batch-size", options->batch_size)->check(CLI::Range(1, 65536));
       sub.add_option("--steps", options->steps, "timed steps per configuration")->check(CLI::Range(1, 100000));
       sub.add_option("--threads", options->threads, "intra-op threads (0: LibTorch's default)")
           ->check(CLI::NonNegativeNumber);
       sub.add_option("--unscale-mib", options->unscale_mib, "gradient MiB for the unscale benchmark")
           ->check(CLI::Range(1, 4096));
       sub.add_option("--device", options->device, "cpu, cuda or cuda:N (the GPU: AMPP_TORCH=cuda, docs/gpu.md)");
       return [options] { return run_bench(*options); };
     }});

}  // namespace
