// GradScaler unscale kernel: 64 fp32 gradients totalling 64 Mi values (256 MiB).
// Every benchmark reads and writes the same 256 MiB once per iteration, at 1 and 2 threads:
//   Baseline/Memcpy : parallel memcpy of the same bytes into a second buffer (read 256 + write 256 MiB)
//   Baseline/Scale  : parallel in-place x *= s with at::vec::Vectorized (the same traffic as the unscale)
//   Fused           : ampp::numerics::non_finite_check_and_unscale_ over all 64 tensors (one call),
//                     once per kernel variant (portable, AVX2)
//   Naive           : per tensor isfinite(t).all().item() then t.mul_(s) (what a port without a kernel does)
//   LibTorch        : at::_amp_foreach_non_finite_check_and_unscale_ (PyTorch's own kernel; CPU since 2.2,
//                     so only in builds against LibTorch >= 2.2)
// Counters: GB/s (read+write bytes / wall time), and ratios against the same-run baselines with the
// same thread count: vs_memcpy, vs_scale (fused/naive bandwidth over baseline bandwidth), and for the
// fused kernel speedup_vs_naive and speedup_vs_libtorch. The scale alternates 2^-16 / 2^16 so values never drift into
// denormals (which would slow every variant down).

#include <ampp/numerics/unscale.h>
#include <ampp/util/torch_version.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>  // at::set_num_threads
#include <ATen/cpu/vec/vec.h>
#include <benchmark/benchmark.h>

#include "ampp/numerics/parallel_chunks.h"

#include <chrono>
#include <cstring>
#include <map>
#include <vector>

namespace {

constexpr int64_t kTensors = 64;
constexpr int64_t kTotal = int64_t{64} << 20;  // 64 Mi values
constexpr int64_t kPer = kTotal / kTensors;
constexpr double kBytes = 2.0 * kTotal * sizeof(float);  // each value read once and written once
constexpr int64_t kChunk = int64_t{1} << 15;

std::vector<at::Tensor>& grads() {
  static std::vector<at::Tensor> g = [] {
    at::manual_seed(0);
    std::vector<at::Tensor> v;
    for (int64_t i = 0; i < kTensors; ++i) v.push_back(at::randn({kPer}));
    return v;
  }();
  return g;
}

// Seconds per iteration measured in this run, per benchmark kind and thread count.
std::map<std::pair<std::string, int64_t>, double>& measured() {
  static std::map<std::pair<std::string, int64_t>, double> m;
  return m;
}

float alternating_scale(int64_t iteration) { return (iteration % 2) ? 65536.0f : 1.0f / 65536.0f; }

// Runs body(iteration) under the benchmark loop; records seconds/iteration and the bandwidth counters.
template <typename Body>
void run(benchmark::State& state, const std::string& kind, Body body) {
  const int64_t threads = state.range(0);
  at::set_num_threads(static_cast<int>(threads));
  grads();  // allocate and touch outside the timed region
  // One counter across all benchmarks: the values only ever alternate between x and x * 2^-16.
  static int64_t it = 0;
  body(it++);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) body(it++);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double per_iter = secs / static_cast<double>(state.iterations());
  measured()[{kind, threads}] = per_iter;
  state.counters["GB/s"] = kBytes / per_iter / 1e9;
  auto ratio = [&](const char* name, const std::string& base) {
    auto f = measured().find({base, threads});
    if (f != measured().end()) state.counters[name] = f->second / per_iter;
  };
  if (kind.rfind("Baseline", 0) != 0) {
    ratio("vs_memcpy", "Baseline/Memcpy");
    ratio("vs_scale", "Baseline/Scale");
  }
  if (kind == "Fused") {
    ratio("speedup_vs_naive", "Naive");
    ratio("speedup_vs_libtorch", "LibTorch");
  }
}

void BM_BaselineMemcpy(benchmark::State& state) {
  static std::vector<at::Tensor> dst = [] {
    std::vector<at::Tensor> v;
    for (int64_t i = 0; i < kTensors; ++i) v.push_back(at::zeros({kPer}));
    return v;
  }();
  const int64_t chunks_per = kPer / kChunk;
  run(state, "Baseline/Memcpy", [&](int64_t) {
    ampp::numerics::detail::parallel_chunks(kTensors * chunks_per, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const int64_t t = c / chunks_per, off = (c % chunks_per) * kChunk;
        std::memcpy(dst[t].data_ptr<float>() + off, grads()[t].data_ptr<float>() + off, kChunk * sizeof(float));
      }
    });
    benchmark::DoNotOptimize(dst[0].data_ptr<float>());
  });
}

void BM_BaselineScale(benchmark::State& state) {
  const int64_t chunks_per = kPer / kChunk;
  run(state, "Baseline/Scale", [&](int64_t i) {
    const float s = alternating_scale(i);
    ampp::numerics::detail::parallel_chunks(kTensors * chunks_per, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        float* p = grads()[c / chunks_per].data_ptr<float>() + (c % chunks_per) * kChunk;
        // The same Vectorized<float> load/multiply/store as the kernel, without the detection.
        using V = at::vec::Vectorized<float>;
        const V vs(s);
        for (int64_t k = 0; k < kChunk; k += V::size()) (V::loadu(p + k) * vs).store(p + k);
      }
    });
    benchmark::ClobberMemory();
  });
}

void BM_Fused(benchmark::State& state) {
  const auto variants = ampp::numerics::unscale_kernel_variants();
  const auto v = static_cast<size_t>(state.range(1));
  if (v >= variants.size() || !ampp::numerics::set_unscale_kernel_variant(variants[v])) {
    state.SkipWithError("kernel variant not built or not supported by this CPU");
    return;
  }
  auto found = at::zeros({});
  run(state, "Fused", [&](int64_t i) {
    found.zero_();
    ampp::numerics::non_finite_check_and_unscale_(grads(), found, at::full({}, alternating_scale(i)));
    if (found.item<float>() != 0.0f) state.SkipWithError("unexpected non-finite value");
  });
  state.SetLabel(variants[v]);
}

void BM_Naive(benchmark::State& state) {
  run(state, "Naive", [&](int64_t i) {
    bool all_finite = true;
    for (auto& g : grads()) {
      all_finite &= at::isfinite(g).all().item<bool>();
      g.mul_(alternating_scale(i));
    }
    if (!all_finite) state.SkipWithError("unexpected non-finite value");
  });
}

#if AMPP_TORCH_AT_LEAST(2, 2)
void BM_LibTorch(benchmark::State& state) {
  auto found = at::zeros({});
  run(state, "LibTorch", [&](int64_t i) {
    found.zero_();
    at::_amp_foreach_non_finite_check_and_unscale_(grads(), found, at::full({}, alternating_scale(i)));
    if (found.item<float>() != 0.0f) state.SkipWithError("unexpected non-finite value");
  });
}
BENCHMARK(BM_LibTorch)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

// Registration order is run order: the baselines and the naive loop run before the fused kernel so
// that its ratios are available.
BENCHMARK(BM_BaselineMemcpy)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BaselineScale)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Naive)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(3);
// Fused/<threads>/<variant>: variant 0 = portable, 1 = AVX2 (when built and supported).
BENCHMARK(BM_Fused)->ArgsProduct({{1, 2}, {0, 1}})->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
