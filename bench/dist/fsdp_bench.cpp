// FullyShardedDataParallel against DDP, 2 processes on this machine, training a GPT (ampp train's, its
// blocks the units) with Adam in FP32 on the same per-rank batches. Each configuration runs in freshly
// forked ranks and reports per rank:
//   * tensor bytes at rest (after a step: parameters, gradients, optimizer state) and at the peak of a
//     step (activations and gathered units included), counted by ampp's CPU allocator wrapper;
//   * peak RSS (VmHWM), median step time;
//   * every step's loss, compared bit for bit between the two (2 ranks: FSDP's average is exact).
// Then, with --limit-mb M, both train again under an OS limit (RLIMIT_DATA) of M MiB of new data per
// rank, set after the model is built: DDP fails where FSDP trains.
//
// Collectives through shared memory (DDP with the hook ampp train uses, FSDP's default), or --gloo for both;
// with --gloo, FSDP also runs without prefetching (FullyShardOptions::prefetch), to measure what it gives.
//
//   build/bench/dist/ampp_fsdp_bench [--steps N] [--limit-mb M] [--gloo]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <ampp/dist/ddp.h>
#include <ampp/dist/fully_shard.h>
#include <ampp/dist/shared_memory_allreduce.h>
#include <ampp/train/allocator.h>
#include <ampp/train/gpt.h>
#include <ampp/train/metrics.h>
#include <ampp/util/tensor_memory.h>

namespace {

using namespace ampp::dist;

constexpr int kWorld = 2;
constexpr int64_t kBatch = 4;

ampp::train::GptOptions gpt() {
  return ampp::train::GptOptions().vocab_size(2048).context(64).n_layer(6).n_head(6).n_embd(384);
}

struct Result {
  double at_rest_mb = 0, peak_mb = 0, peak_rss_mb = 0, step_ms = 0;
  bool out_of_memory = false;
  int steps_done = 0;
  std::vector<double> losses;
};

double mb(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// VmData of this process, in bytes: what RLIMIT_DATA is compared with.
int64_t data_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmData:", 0) == 0) return std::stoll(line.substr(7)) * 1024;
  return 0;
}

void limit_new_data(double limit_mb) {
  const auto limit = static_cast<rlim_t>(data_bytes() + static_cast<int64_t>(limit_mb * (1 << 20)));
  rlimit r{limit, limit};
  TORCH_CHECK(::setrlimit(RLIMIT_DATA, &r) == 0, "setrlimit(RLIMIT_DATA): ", std::strerror(errno));
}

torch::Tensor tokens_of(int step, int rank) {
  auto gen = at::detail::createCPUGenerator(1000 * step + rank);
  return torch::randint(gpt().vocab_size(), {kBatch, gpt().context() + 1}, gen, torch::kLong);
}

// Trains `steps` steps with DDP or FSDP; stops at the first allocation the limit refuses.
Result run_rank(bool fsdp, int rank, int port, int steps, double limit_mb, bool gloo, bool prefetch) {
  at::set_num_threads(1);
  ampp::train::return_freed_memory();  // both configurations: the process size follows the live tensors
  auto& tracker = ampp::TensorMemoryTracker::install();
  auto pg =
      init_process_group(InitOptions()
                             .init_method(fmt::format("tcp://127.0.0.1:{}?rank={}&world_size={}", port, rank, kWorld))
                             .set_default(false));
  torch::manual_seed(0);
  auto model = ampp::train::make_gpt(gpt());
  std::unique_ptr<FullyShardedDataParallel> sharded;
  std::unique_ptr<DistributedDataParallel<std::shared_ptr<ampp::train::ClassifierImpl>>> ddp;
  std::vector<torch::Tensor> params;
  if (fsdp) {
    sharded = std::make_unique<FullyShardedDataParallel>(
        model, model->sharding_units(), FullyShardOptions().process_group(pg).shared_memory(!gloo).prefetch(prefetch));
    params = sharded->parameters();
  } else {
    ddp = std::make_unique<DistributedDataParallel<std::shared_ptr<ampp::train::ClassifierImpl>>>(model, pg);
    if (!gloo) ddp->register_comm_hook(shared_memory_allreduce_hook(pg));  // as ampp train's DDP
    params = model->parameters();
  }
  torch::optim::Adam opt(params, torch::optim::AdamOptions(1e-4));
  if (limit_mb > 0) limit_new_data(limit_mb);
  Result result;
  std::vector<double> times;
  try {
    for (int step = 0; step < steps; ++step) {
      if (step == 1) tracker.reset_peak();  // from the second step on: Adam's state exists
      const auto tokens = tokens_of(step, rank);
      const auto start = std::chrono::steady_clock::now();
      opt.zero_grad();
      const auto x = tokens.narrow(1, 0, gpt().context()), y = tokens.narrow(1, 1, gpt().context());
      auto logits = fsdp ? sharded->forward<ampp::train::ClassifierImpl>(x) : ddp->forward(x);
      auto loss = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
      loss.backward();
      opt.step();
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      result.losses.push_back(loss.item<double>());
      result.steps_done = step + 1;
    }
  } catch (const c10::Error& e) {
    result.out_of_memory = true;
    std::fprintf(stderr, "[%s rank %d] step %d: %s\n", fsdp ? "FSDP" : "DDP", rank, result.steps_done,
                 e.what_without_backtrace());
    std::_Exit(3);  // the other rank waits in a collective: the parent ends it
  }
  std::sort(times.begin() + 1, times.end());
  result.step_ms = times.size() > 1 ? times[1 + (times.size() - 1) / 2] : times[0];
  result.at_rest_mb = mb(tracker.current());
  result.peak_mb = mb(tracker.peak());
  result.peak_rss_mb = ampp::train::peak_rss_mb();
  return result;
}

std::string serialise(const Result& r) {
  std::ostringstream out;
  out.precision(17);
  out << r.at_rest_mb << ' ' << r.peak_mb << ' ' << r.peak_rss_mb << ' ' << r.step_ms << ' ' << r.steps_done;
  for (double l : r.losses) out << ' ' << l;
  return out.str();
}

Result parse(const std::string& text) {
  std::istringstream in(text);
  Result r;
  in >> r.at_rest_mb >> r.peak_mb >> r.peak_rss_mb >> r.step_ms >> r.steps_done;
  for (double l; in >> l;) r.losses.push_back(l);
  return r;
}

// Forks the ranks of one configuration; each writes its Result into a file the parent reads. A rank that
// fails (out of memory under the limit) makes the configuration fail: the parent stops the others.
std::vector<Result> run_config(bool fsdp, int steps, double limit_mb, bool gloo, bool prefetch = true) {
  static int runs = 0;
  const int port = 29700 + static_cast<int>(::getpid() % 1000) * 4 + runs++;
  std::vector<pid_t> pids;
  std::fflush(stdout);
  for (int rank = 0; rank < kWorld; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const Result r = run_rank(fsdp, rank, port, steps, limit_mb, gloo, prefetch);
      std::ofstream(fmt::format("/tmp/ampp_fsdp_bench.{}.{}", ::getppid(), rank)) << serialise(r);
      std::_Exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<Result> results(kWorld);
  bool failed = false;
  for (int done = 0; done < kWorld; ++done) {
    int status = 0;
    const pid_t pid = ::wait(&status);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !failed) {
      failed = true;
      for (pid_t other : pids)
        if (other != pid) ::kill(other, SIGKILL);
    }
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    const auto path = fmt::format("/tmp/ampp_fsdp_bench.{}.{}", ::getpid(), rank);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    results[rank] = failed ? Result{} : parse(text.str());
    results[rank].out_of_memory = failed;
    std::remove(path.c_str());
  }
  return results;
}

Result worst(const std::vector<Result>& rs) {
  Result w = rs[0];
  for (const auto& r : rs) {
    w.at_rest_mb = std::max(w.at_rest_mb, r.at_rest_mb);
    w.peak_mb = std::max(w.peak_mb, r.peak_mb);
    w.peak_rss_mb = std::max(w.peak_rss_mb, r.peak_rss_mb);
    w.step_ms = std::max(w.step_ms, r.step_ms);
  }
  return w;
}

// The two configurations side by side. The ideal FSDP rank holds at rest 1/N of the parameters, gradients
// and Adam's two moments (4 FP32 copies of the model).
void print_comparison(const std::vector<Result>& ddp, const std::vector<Result>& fsdp, int64_t params,
                      int64_t largest_unit) {
  const Result d = worst(ddp), f = worst(fsdp);
  fmt::print("{:<6} {:>12} {:>12} {:>12} {:>10}   (max over ranks)\n", "", "at rest MiB", "step peak", "peak RSS",
             "step ms");
  for (const auto& [name, r] : {std::pair{"DDP", d}, std::pair{"FSDP", f}})
    fmt::print("{:<6} {:>12.1f} {:>12.1f} {:>12.1f} {:>10.1f}\n", name, r.at_rest_mb, r.peak_mb, r.peak_rss_mb,
               r.step_ms);
  const double whole = mb(params * 4 * 4);
  fmt::print(
      "FSDP/DDP: at rest {:.3f}x (the parameters, gradients and Adam's two moments are {:.1f} MiB whole, "
      "FSDP's ideal 1/{} of them {:.1f} MiB; DDP adds its gradient buckets), step peak {:.3f}x (FSDP's with "
      "a gathered unit: {:.1f} MiB with its gradient), peak RSS {:.3f}x, step time {:.3f}x\n",
      f.at_rest_mb / d.at_rest_mb, whole, kWorld, whole / kWorld, f.peak_mb / d.peak_mb, mb(largest_unit * 4 * 2),
      f.peak_rss_mb / d.peak_rss_mb, f.step_ms / d.step_ms);
  int equal = 0, compared = 0;
  for (int rank = 0; rank < kWorld; ++rank)
    for (size_t s = 0; s < ddp[rank].losses.size() && s < fsdp[rank].losses.size(); ++s, ++compared)
      equal += ddp[rank].losses[s] == fsdp[rank].losses[s] ? 1 : 0;
  fmt::print("losses: {} of {} (steps x ranks) bit-identical to DDP's\n", equal, compared);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  double limit_mb = 0;
  bool gloo = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--gloo")
      gloo = true;
    else if (flag == "--steps" && i + 1 < argc)
      steps = std::stoi(argv[++i]);
    else if (flag == "--limit-mb" && i + 1 < argc)
      limit_mb = std::stod(argv[++i]);
    else
      TORCH_CHECK(false, "usage: ampp_fsdp_bench [--steps N] [--limit-mb M] [--gloo]");
  }
  TORCH_CHECK(steps >= 2, "--steps must be at least 2 (the first step is not timed)");
  torch::manual_seed(0);
  auto model = ampp::train::make_gpt(gpt());
  int64_t params = 0, largest_unit = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  for (const auto& unit : model->sharding_units()) {
    int64_t n = 0;
    for (const auto& p : unit->parameters()) n += p.numel();
    largest_unit = std::max(largest_unit, n);
  }
  fmt::print(
      "GPT {} layers x {}, context {}, vocabulary {}: {:.1f} M parameters; Adam, FP32; {} ranks x 1 thread, "
      "batch {} per rank, {} steps (the first untimed)\n",
      gpt().n_layer(), gpt().n_embd(), gpt().context(), gpt().vocab_size(), static_cast<double>(params) / 1e6, kWorld,
      kBatch, steps);
  fmt::print("collectives: {}\n",
             gloo ? "Gloo (--gloo)" : "shared memory (DDP's hook as in ampp train; FSDP's default)");
  const auto ddp = run_config(false, steps, 0, gloo), fsdp = run_config(true, steps, 0, gloo);
  print_comparison(ddp, fsdp, params, largest_unit);
  if (gloo) {  // prefetching overlaps the backend's all-gathers with compute (shared memory copies in line)
    const Result with = worst(fsdp), without = worst(run_config(true, steps, 0, gloo, /*prefetch=*/false));
    fmt::print(
        "FSDP prefetching the next unit's all-gather: step {:.1f} ms, without {:.1f} ms ({:.3f}x); "
        "step peak {:.1f} MiB, without {:.1f} MiB\n",
        with.step_ms, without.step_ms, with.step_ms / without.step_ms, with.peak_mb, without.peak_mb);
  }
  if (limit_mb <= 0) return 0;
  fmt::print("\nunder a limit of {:.0f} MiB of new data per rank (RLIMIT_DATA, set after the model is built):\n",
             limit_mb);
  for (bool sharded : {false, true}) {
    const auto results = run_config(sharded, steps, limit_mb, gloo);
    fmt::print("{:<5} {}\n", sharded ? "FSDP" : "DDP",
               results[0].out_of_memory ? "failed: out of memory (its error is above)"
                                        : fmt::format("trained {} steps, peak RSS {:.1f} MiB", results[0].steps_done,
                                                      worst(results).peak_rss_mb));
  }
}
