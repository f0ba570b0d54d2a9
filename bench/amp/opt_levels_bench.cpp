// O0/O1/O2/O3 x bf16/fp16 on the reference MLP and CNN (Fashion-MNIST shapes, batch 256).
//
// Prints, against O0 of the same model measured in the same run:
//   * step time ratio (Google Benchmark, full step: zero_grad, forward, loss, backward, step);
//   * peak RSS ratio, each configuration in a fresh child process (peak RSS only grows within a process);
//   * the share of the step spent in ampp's own machinery (loss scaling, unscale + inf check, grad
//     copies into FP32 masters, master copy-back, input/output casts), from Properties::profile(true).
//
// Threads: one OpenMP thread and one OpenBLAS thread, so configurations compete for nothing.
#include <ampp/amp/initialize.h>
#include <ampp/train/allocator.h>
#include <ampp/train/metrics.h>
#include <ampp/train/models.h>
#include <ampp/util/threads.h>

#include <benchmark/benchmark.h>
#include <fmt/core.h>
#include <torch/torch.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace nn = torch::nn;

struct Config {
  std::string model;  // "mlp" | "cnn"
  std::string level;  // "O0".."O3"
  std::string dtype;  // "bf16" | "fp16" ("-" for O0)
  std::string name() const { return fmt::format("{}/{}/{}", model, level, dtype); }
};

std::vector<Config> configs() {
  std::vector<Config> out;
  for (const char* m : {"mlp", "cnn"}) {
    out.push_back({m, "O0", "-"});
    for (const char* d : {"bf16", "fp16"}) {
      for (const char* l : {"O1", "O2", "O3"}) out.push_back({m, l, d});
    }
  }
  return out;
}

void single_thread() { ampp::set_compute_threads(1); }

constexpr int64_t kBatch = 256;

// One training setup; step() is the seed 004 loop body.
struct Trainer {
  std::shared_ptr<nn::Module> model;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::unique_ptr<torch::optim::SGD> opt;
  std::unique_ptr<ampp::Amp> amp;
  torch::Tensor x, y;

  explicit Trainer(const Config& c) {
    torch::manual_seed(0);
    auto m = ampp::train::make_model(c.model);  // the reference "mlp" and "cnn" of ampp train
    model = m;
    forward = [this, m](const torch::Tensor& in) { return amp->forward(m, in); };
    opt = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    ampp::Properties props(c.level);
    if (c.dtype == "fp16") props.dtype(torch::kHalf);
    if (c.dtype == "bf16") props.dtype(torch::kBFloat16);
    amp = std::make_unique<ampp::Amp>(ampp::initialize(model, *opt, props.verbosity(0).profile(true)));
    x = torch::randn({kBatch, 1, 28, 28});
    y = torch::randint(10, {kBatch}, torch::kLong);
  }

  void step() {
    amp->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(forward(x), y);
    amp->scale_loss(loss).backward();
    amp->step();
  }
};

void BM_Step(benchmark::State& state, Config c) {
  single_thread();
  Trainer t(c);
  for (int i = 0; i < 3; ++i) t.step();  // warm-up: allocator, oneDNN primitives, lazy scale
  const ampp::AmpProfile before = t.amp->profile();
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    t.step();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const ampp::AmpProfile after = t.amp->profile();
  state.counters["amp_overhead"] = (after.total_seconds() - before.total_seconds()) / seconds;
  state.counters["skipped"] = static_cast<double>(t.amp->skipped_steps());
}

// Collects real time and counters per benchmark name for the ratio tables.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  struct Result {
    double ms = 0, overhead = 0;
  };
  std::map<std::string, Result> results;
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.run_type != Run::RT_Iteration) continue;
      Result res;
      res.ms = r.GetAdjustedRealTime();  // registered with kMillisecond
      auto it = r.counters.find("amp_overhead");
      if (it != r.counters.end()) res.overhead = it->second.value;
      // "Step/cnn/O2/bf16/min_time:0.500/real_time" -> "cnn/O2/bf16"
      std::string name = r.benchmark_name().substr(std::string("Step/").size());
      name = name.substr(0, name.find("/min_time"));
      name = name.substr(0, name.find("/real_time"));
      results[name] = res;
    }
  }
};

long current_rss_kib() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// Child mode: run `steps` steps of one configuration; print the RSS before building the model and the
// peak RSS, in KiB. Their difference is what training this configuration costs in memory.
int rss_child(const Config& c, int steps) {
  single_thread();
  (void)torch::ones({1}).sum();  // load LibTorch's lazily initialised pieces before the baseline
  const long before = current_rss_kib();
  Trainer t(c);
  for (int i = 0; i < steps; ++i) t.step();
  // Peak from VmHWM (ampp::train::peak_rss_mb): ru_maxrss would include the parent's peak (kept across exec).
  std::printf("%ld %ld\n", before, static_cast<long>(ampp::train::peak_rss_mb() * 1024));
  return 0;
}

struct Rss {
  long base = -1, peak = -1;
  long training() const { return peak - base; }
};

Rss spawn_rss_child(const Config& c) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<std::string> args = {"/proc/self/exe", "--rss-child", c.model, c.level, c.dtype, "5"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return {};
  }
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  Rss rss;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      std::sscanf(out.c_str(), "%ld %ld", &rss.base, &rss.peak) != 2) {
    return {};
  }
  return rss;
}

}  // namespace

int main(int argc, char** argv) {
  ampp::train::retain_freed_memory();  // the allocator setup `ampp train` runs with
  if (argc == 6 && std::string(argv[1]) == "--rss-child") {
    return rss_child({argv[2], argv[3], argv[4]}, std::stoi(argv[5]));
  }
  for (const auto& c : configs()) {
    benchmark::RegisterBenchmark(("Step/" + c.name()).c_str(), BM_Step, c)
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.5)
        ->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  fmt::print(
      "\n| model | level | dtype | step ms | step / O0 | peak RSS MiB | peak RSS / O0 | training RSS MiB | "
      "training RSS / O0 | AMP machinery / step |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|\n");
  std::map<std::string, Rss> rss;
  for (const auto& c : configs()) rss[c.name()] = spawn_rss_child(c);
  for (const auto& c : configs()) {
    auto it = reporter.results.find(c.name());
    if (it == reporter.results.end()) continue;  // filtered out
    const auto base = reporter.results.find(Config{c.model, "O0", "-"}.name());
    const double t0 = base != reporter.results.end() ? base->second.ms : 0;
    const Rss r0 = rss[Config{c.model, "O0", "-"}.name()], r = rss[c.name()];
    fmt::print("| {} | {} | {} | {:.2f} | {:.2f} | {:.0f} | {:.3f} | {:.1f} | {:.2f} | {:.2f}% |\n", c.model, c.level,
               c.dtype, it->second.ms, t0 > 0 ? it->second.ms / t0 : 0.0, r.peak / 1024.0,
               r0.peak > 0 ? double(r.peak) / r0.peak : 0.0, r.training() / 1024.0,
               r0.training() > 0 ? double(r.training()) / r0.training() : 0.0, 100.0 * it->second.overhead);
  }
  benchmark::Shutdown();
  return 0;
}
