// Autocast precision policies on the reference MLP and CNN (Fashion-MNIST shapes, batch 256):
// one training step (forward + backward + SGD step) per iteration, for
//   fp32                 no autocast (the baseline)
//   libtorch_bf16        LibTorch's own CPU autocast (ampp's kernels uninstalled)
//   ampp_bf16            ampp::autocast bf16 with the automatic Bf16Compute choice
//   ampp_bf16_native     ... forced Bf16Compute::kNative (LibTorch's bf16 kernels)
//   ampp_bf16_fp32gemm   ... forced Bf16Compute::kFp32 (bf16 storage, fp32 GEMMs/convolutions)
//   ampp_fp16_emulated   ampp::autocast fp16 on CPU (fp16 rounding, fp32 compute)
// Printed at the end: step time and peak tensor memory as ratios to fp32 measured in the same run
// (best of the repetitions; the machine is shared, so only same-run ratios mean anything).
//
// Threads: AMPP_BENCH_THREADS (default 1) for ATen and OpenBLAS.

#include <ampp/precision/autocast.h>
#include <ampp/precision/cpu_features.h>
#include <ampp/precision/kernels.h>
#include <ampp/train/allocator.h>
#include <ampp/train/models.h>
#include <ampp/util/tensor_memory.h>
#include <ampp/util/threads.h>

#include <ampp/precision/torch_compat.h>
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdlib>
#include <map>
#include <optional>

namespace {

enum class Mode { fp32, libtorch_bf16, ampp_bf16, ampp_bf16_native, ampp_bf16_fp32gemm, ampp_fp16 };

const char* name_of(Mode m) {
  switch (m) {
    case Mode::fp32:
      return "fp32";
    case Mode::libtorch_bf16:
      return "libtorch_bf16";
    case Mode::ampp_bf16:
      return "ampp_bf16";
    case Mode::ampp_bf16_native:
      return "ampp_bf16_native";
    case Mode::ampp_bf16_fp32gemm:
      return "ampp_bf16_fp32gemm";
    case Mode::ampp_fp16:
      return "ampp_fp16_emulated";
  }
  return "?";
}

// LibTorch's own CPU autocast, the way a C++ user writes it without ampp.
struct LibTorchAutocast {
  LibTorchAutocast() {
    ampp::precision::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
    ampp::precision::compat::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~LibTorchAutocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    ampp::precision::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
  }
};

torch::Tensor forward_loss(ampp::train::ClassifierImpl& net, Mode mode, const torch::Tensor& x,
                           const torch::Tensor& y) {
  auto loss_of = [&] { return torch::cross_entropy_loss(net.forward(x), y); };
  switch (mode) {
    case Mode::fp32:
      return loss_of();
    case Mode::libtorch_bf16: {
      LibTorchAutocast region;
      return loss_of();
    }
    case Mode::ampp_bf16: {
      ampp::autocast region(torch::kCPU, torch::kBFloat16);
      return loss_of();
    }
    case Mode::ampp_bf16_native:
    case Mode::ampp_bf16_fp32gemm: {
      const auto compute = mode == Mode::ampp_bf16_native ? ampp::Bf16Compute::kNative : ampp::Bf16Compute::kFp32;
      ampp::autocast region(torch::kCPU, torch::kBFloat16, true, ampp::AutocastOptions().bf16_compute(compute));
      return loss_of();
    }
    case Mode::ampp_fp16: {
      ampp::autocast region(torch::kCPU, torch::kHalf);
      return loss_of();
    }
  }
  return {};
}

struct Result {
  double best_ms = 1e300;      // wall time per step
  double best_cpu_ms = 1e300;  // process CPU time per step (robust when the machine is oversubscribed)
  double peak_mb = 0;
};
std::map<std::string, std::map<std::string, Result>>& results() {
  static std::map<std::string, std::map<std::string, Result>> r;
  return r;
}

// The reference models are ampp::train's "mlp" (784-256-128-10) and "cnn" (conv16-BN-conv32-BN-fc128-fc10).
void BM_Step(benchmark::State& state, const char* model, Mode mode) {
  auto& tracker = ampp::TensorMemoryTracker::install();
  if (mode == Mode::libtorch_bf16)
    ampp::precision::uninstall_autocast_kernels();
  else
    ampp::precision::install_autocast_kernels();
  torch::manual_seed(0);
  const auto x = torch::randn({256, 1, 28, 28});
  const auto y = torch::randint(0, 10, {256});
  const int64_t baseline = tracker.current();
  auto net_ptr = ampp::train::make_model(model);
  auto& net = *net_ptr;
  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto step = [&] {
    opt.zero_grad();
    auto loss = forward_loss(net, mode, x, y);
    loss.backward();
    opt.step();
  };
  step();  // warm-up: grads and momentum buffers exist from here on, as in training
  tracker.reset_peak();
  for (auto _ : state) step();
  const double peak_mb = double(tracker.peak() - baseline) / (1 << 20);
  state.counters["peak_MB"] = peak_mb;
  auto& r = results()[model][name_of(mode)];
  r.peak_mb = std::max(r.peak_mb, peak_mb);
  ampp::precision::install_autocast_kernels();
}

// Records the best per-iteration time of every repetition.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.iterations == 0) continue;
      const std::string name = run.benchmark_name();  // "Step/<model>/<mode>..."
      const auto a = name.find('/'), b = name.find('/', a + 1);
      const auto c = name.find('/', b + 1);
      const std::string model = name.substr(a + 1, b - a - 1), mode = name.substr(b + 1, c - b - 1);
      auto& r = results()[model][mode];
      const double ms = run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit) * 1e3;
      r.best_ms = std::min(r.best_ms, ms);
      const double cpu_ms = run.GetAdjustedCPUTime() / benchmark::GetTimeUnitMultiplier(run.time_unit) * 1e3;
      r.best_cpu_ms = std::min(r.best_cpu_ms, cpu_ms);
    }
  }
};

void register_all() {
  for (Mode m : {Mode::fp32, Mode::libtorch_bf16, Mode::ampp_bf16, Mode::ampp_bf16_native, Mode::ampp_bf16_fp32gemm,
                 Mode::ampp_fp16}) {
    benchmark::RegisterBenchmark(fmt::format("Step/mlp/{}", name_of(m)).c_str(), BM_Step, "mlp", m)
        ->Unit(benchmark::kMillisecond)
        ->MinTime(1.0)
        ->UseRealTime();
    benchmark::RegisterBenchmark(fmt::format("Step/cnn/{}", name_of(m)).c_str(), BM_Step, "cnn", m)
        ->Unit(benchmark::kMillisecond)
        ->MinTime(2.0)
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  ampp::train::retain_freed_memory();  // the allocator setup `ampp train` runs with
  const char* env = std::getenv("AMPP_BENCH_THREADS");
  const int threads = env ? std::atoi(env) : 1;
  ampp::set_compute_threads(threads);
  register_all();
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const auto& bf16 = ampp::precision::cpu_bf16_support();
  fmt::print("\nthreads={} cpu bf16 units: {} -> automatic Bf16Compute = {}\n", threads, bf16.describe(),
             ampp::to_string(ampp::default_bf16_compute()));
  fmt::print("{:<6} {:<20} {:>9} {:>8} {:>9} {:>8} {:>9} {:>8}\n", "model", "mode", "wall ms", "vs fp32", "cpu ms",
             "vs fp32", "peak MB", "vs fp32");
  for (const auto& [model, modes] : results()) {
    auto base = modes.find("fp32");
    for (const auto& [mode, r] : modes) {
      if (r.best_ms > 1e299) continue;
      const bool have_base = base != modes.end() && base->second.best_ms < 1e299;
      const auto& b = base->second;
      fmt::print("{:<6} {:<20} {:>9.2f} {:>7.3f}x {:>9.2f} {:>7.3f}x {:>9.2f} {:>7.3f}x\n", model, mode, r.best_ms,
                 have_base ? r.best_ms / b.best_ms : 0.0, r.best_cpu_ms,
                 have_base ? r.best_cpu_ms / b.best_cpu_ms : 0.0, r.peak_mb, have_base ? r.peak_mb / b.peak_mb : 0.0);
    }
  }
  benchmark::Shutdown();
  return 0;
}
