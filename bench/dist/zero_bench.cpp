// ZeroRedundancyOptimizer against plain DDP + Adam, 2 processes on this machine, on a wide MLP of
// ~25 M parameters (big enough that optimizer state dominates). For FP32 (O0) and apex O2 (bf16
// model, FP32 masters), each configuration runs in two freshly forked ranks and reports per rank:
//   * optimizer-state + FP32-master bytes (counted from the tensors themselves),
//   * peak RSS (VmHWM of the rank process),
//   * median step time,
// and the ratios ZeRO / plain measured in this run, next to the ideal ratio (state and masters / N).
//
//   build/bin/ampp_zero_bench [--steps N]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <ampp/amp/initialize.h>
#include <ampp/dist/ddp.h>
#include <ampp/dist/zero_redundancy_optimizer.h>
#include <ampp/train/metrics.h>

namespace {

using namespace ampp::dist;

constexpr int kWorld = 2;
constexpr int64_t kWidth = 2048, kIn = 1024, kHidden = 5, kBatch = 64;

struct WideMlpImpl : torch::nn::Module {
  torch::nn::Sequential layers;
  WideMlpImpl() {
    layers->push_back(torch::nn::Linear(kIn, kWidth));
    for (int64_t i = 0; i < kHidden; ++i) {
      layers->push_back(torch::nn::ReLU());
      layers->push_back(torch::nn::Linear(kWidth, kWidth));
    }
    layers->push_back(torch::nn::ReLU());
    layers->push_back(torch::nn::Linear(kWidth, kIn));
    register_module("layers", layers);
  }
  torch::Tensor forward(torch::Tensor x) { return layers->forward(x); }
};
TORCH_MODULE(WideMlp);

struct Config {
  const char* name;
  bool zero;
  const char* opt_level;
};

struct Result {
  double state_mb = 0, masters_mb = 0, peak_rss_mb = 0, step_ms = 0;
};

double mb(const torch::Tensor& t) { return t.defined() ? static_cast<double>(t.nbytes()) / (1 << 20) : 0.0; }

double adam_state_mb(torch::optim::Optimizer& optimizer) {
  double total = 0;
  for (auto& [key, state] : optimizer.state()) {
    auto& adam = static_cast<torch::optim::AdamParamState&>(*state);
    total += mb(adam.exp_avg()) + mb(adam.exp_avg_sq()) + mb(adam.max_exp_avg_sq());
  }
  return total;
}

// FP32 tensors the optimizer steps that are not the model's own parameters: the O2 masters.
double masters_mb(const std::vector<torch::Tensor>& stepped, const WideMlp& model) {
  std::unordered_set<const void*> own;
  for (const auto& p : model->parameters()) own.insert(p.unsafeGetTensorImpl());
  double total = 0;
  for (const auto& t : stepped) total += own.count(t.unsafeGetTensorImpl()) ? 0.0 : mb(t);
  return total;
}

Result run_rank(const Config& config, int rank, int port, int steps) {
  at::set_num_threads(1);
  auto pg =
      init_process_group(InitOptions()
                             .init_method(fmt::format("tcp://127.0.0.1:{}?rank={}&world_size={}", port, rank, kWorld))
                             .set_default(false));
  torch::manual_seed(0);  // one seed: O2's masters are taken before DDP's broadcast
  WideMlp model;
  const torch::optim::AdamOptions adam(1e-4);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ZeroRedundancyOptimizer* zero = nullptr;
  if (config.zero) {
    auto z = std::make_unique<ZeroRedundancyOptimizer>(
        std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(model->parameters())},
        ZeroRedundancyOptimizer::factory_of<torch::optim::Adam>(adam),
        ZeroRedundancyOptimizerOptions().process_group(pg));
    zero = z.get();
    optimizer = std::move(z);
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), adam);
  }
  auto amp = ampp::initialize(model, *optimizer, ampp::Properties(config.opt_level).verbosity(0));
  DistributedDataParallel<WideMlp> ddp(model, pg);
  auto gen = at::detail::createCPUGenerator(rank + 1);
  const auto x = torch::randn({kBatch, kIn}, gen), y = torch::randn({kBatch, kIn}, gen);
  std::vector<double> times;
  for (int step = 0; step < steps + 2; ++step) {  // 2 warm-up steps create the state
    const auto start = std::chrono::steady_clock::now();
    amp.zero_grad();
    amp.scale_loss(torch::mse_loss(amp.forward(ddp, x), y)).backward();
    amp.step();
    if (step >= 2)
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  auto& holder = zero ? zero->local_optimizer() : *optimizer;
  std::vector<torch::Tensor> stepped;
  for (const auto& group : holder.param_groups())
    stepped.insert(stepped.end(), group.params().begin(), group.params().end());
  return {adam_state_mb(holder), masters_mb(stepped, model), ampp::train::peak_rss_mb(), times[times.size() / 2]};
}

// Forks the ranks of one configuration; each writes its Result into a file the parent reads.
std::vector<Result> run_config(const Config& config, int steps) {
  static int runs = 0;  // a fresh port per configuration: the previous store's may still linger
  const int port = 29600 + static_cast<int>(::getpid() % 1000) * 4 + runs++;
  std::vector<pid_t> pids;
  std::fflush(stdout);  // or the children's exit would print the parent's pending lines again
  for (int rank = 0; rank < kWorld; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const Result r = run_rank(config, rank, port, steps);
      std::ofstream(fmt::format("/tmp/ampp_zero_bench.{}.{}", ::getppid(), rank))
          << r.state_mb << ' ' << r.masters_mb << ' ' << r.peak_rss_mb << ' ' << r.step_ms;
      std::_Exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<Result> results;
  for (int rank = 0; rank < kWorld; ++rank) {
    int status = 0;
    ::waitpid(pids[static_cast<size_t>(rank)], &status, 0);
    TORCH_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, config.name, ": rank ", rank, " failed");
    const auto path = fmt::format("/tmp/ampp_zero_bench.{}.{}", ::getpid(), rank);
    Result r;
    std::ifstream(path) >> r.state_mb >> r.masters_mb >> r.peak_rss_mb >> r.step_ms;
    std::remove(path.c_str());
    results.push_back(r);
  }
  return results;
}

Result worst(const std::vector<Result>& rs) {
  Result w;
  for (const auto& r : rs) {
    w.state_mb = std::max(w.state_mb, r.state_mb);
    w.masters_mb = std::max(w.masters_mb, r.masters_mb);
    w.peak_rss_mb = std::max(w.peak_rss_mb, r.peak_rss_mb);
    w.step_ms = std::max(w.step_ms, r.step_ms);
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 2 && std::string(argv[1]) == "--steps" ? std::stoi(argv[2]) : 8;
  int64_t params = 0;
  for (const auto& p : WideMlp()->parameters()) params += p.numel();
  fmt::print("wide MLP: {:.1f} M parameters, Adam, {} ranks x 1 thread, batch {} per rank, {} timed steps\n",
             static_cast<double>(params) / 1e6, kWorld, kBatch, steps);
  fmt::print("{:<14} {:>10} {:>10} {:>10} {:>10}   (max over ranks)\n", "config", "state MB", "masters MB", "peak RSS",
             "step ms");
  for (const char* level : {"O0", "O2"}) {
    const Config plain{"DDP+Adam", false, level}, sharded{"ZeRO-1", true, level};
    const Result p = worst(run_config(plain, steps)), z = worst(run_config(sharded, steps));
    for (const auto& [name, r] : {std::pair{plain.name, p}, std::pair{sharded.name, z}})
      fmt::print("{:<14} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n", fmt::format("{} {}", level, name), r.state_mb,
                 r.masters_mb, r.peak_rss_mb, r.step_ms);
    const double ideal = 1.0 / kWorld;
    fmt::print("{} ZeRO/plain: state+masters {:.3f}x (ideal {:.3f}x), peak RSS {:.3f}x, step time {:.3f}x\n\n", level,
               (z.state_mb + z.masters_mb) / (p.state_mb + p.masters_mb), ideal, z.peak_rss_mb / p.peak_rss_mb,
               z.step_ms / p.step_ms);
  }
}
