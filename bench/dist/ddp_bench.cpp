// DDP on Gloo, 2 processes on this machine (rank 1 is forked at start and mirrors rank 0's
// benchmarks through a command broadcast). Measures, in one run:
//  * training throughput of the reference CNN, global batch 64: 1 process vs 2-process DDP;
//  * DDP's bucketed gradient allreduce vs one raw Gloo allreduce of a flat buffer of the same bytes;
//  * bytes on the wire (loopback counters inside a private network namespace) and step time with
//    fp16/bf16 compression hooks vs plain;
//  * the fraction of DDP communication hidden behind backward (from the reducer's timeline);
//  * gradient_as_bucket_view (grads live in the buckets) vs the default copies in and out.
// A summary with same-run ratios is printed at the end.
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include <ampp/dist/ddp.h>
#include <ampp/dist/log.h>

namespace {

using namespace ampp::dist;
using Clock = std::chrono::steady_clock;

constexpr int64_t kGlobalBatch = 64;

// The reference CNN (conv32-BN-conv64-BN-pool-fc128-fc10 on 28x28, as in the project notes).
struct CnnImpl : torch::nn::Module {
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::BatchNorm2d b1{nullptr}, b2{nullptr};
  torch::nn::Linear f1{nullptr}, f2{nullptr};
  CnnImpl() {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)));
    b1 = register_module("b1", torch::nn::BatchNorm2d(32));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
    b2 = register_module("b2", torch::nn::BatchNorm2d(64));
    f1 = register_module("f1", torch::nn::Linear(64 * 14 * 14, 128));
    f2 = register_module("f2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(b1(c1(x)));
    x = torch::max_pool2d(torch::relu(b2(c2(x))), 2);
    return f2(torch::relu(f1(x.flatten(1))));
  }
};
TORCH_MODULE(Cnn);

enum Cmd : int64_t {
  kStop,
  kTrainSolo,
  kTrainDdp,
  kTrainDdpFp16,
  kTrainDdpBf16,
  kTrainDdpBucketView,
  kFlatAllreduce,
  kCommPlain,
  kCommFp16,
  kCommBf16,
  kCommPaired
};
bool is_training(Cmd cmd) { return cmd >= kTrainSolo && cmd <= kTrainDdpBucketView; }

ProcessGroup g_pg;
std::map<std::string, double> g_results;  // name -> seconds per iteration (or value)

// Rank 0 tells rank 1 what to run next (and how often), so both issue the same collectives.
void send_command(Cmd cmd, int64_t iters) {
  std::vector<torch::Tensor> t{torch::tensor({static_cast<int64_t>(cmd), iters})};
  g_pg.c10d()->broadcast(t)->wait();
}

int64_t lo_tx_bytes() {
  std::ifstream f("/proc/net/dev");
  std::string line;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != "lo") continue;
    std::istringstream in(line.substr(colon + 1));
    int64_t v[9];
    for (auto& x : v) in >> x;
    return v[8];  // transmit bytes
  }
  return 0;
}

template <typename F>
void loop(benchmark::State* st, int64_t iters, F&& f) {
  if (st) {
    for (auto _ : *st) f();
  } else {
    for (int64_t i = 0; i < iters; ++i) f();
  }
}

struct Batch {
  torch::Tensor x, y;
};
Batch make_batch(int64_t n, int seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return {torch::randn({n, 1, 28, 28}, gen, torch::kFloat), torch::randint(0, 10, {n}, gen, torch::kLong)};
}

// [first bucket launch, last bucket completion] of one backward, in seconds.
double allreduce_window(const IterationTimeline& tl) {
  if (tl.buckets.empty()) return 0;
  auto begin = tl.buckets.front().launched, end = tl.buckets.front().completed;
  for (const auto& b : tl.buckets) {
    begin = std::min(begin, b.launched);
    end = std::max(end, b.completed);
  }
  return std::chrono::duration<double>(end - begin).count();
}

double hidden_fraction(const IterationTimeline& tl) {
  if (tl.buckets.empty()) return 0;
  auto begin = tl.buckets.front().launched, end = tl.buckets.front().completed;
  for (const auto& b : tl.buckets) {
    begin = std::min(begin, b.launched);
    end = std::max(end, b.completed);
  }
  const double window = std::chrono::duration<double>(end - begin).count();
  const double hidden = std::chrono::duration<double>(std::min(end, tl.finalize_begin) - begin).count();
  return window > 0 ? std::max(0.0, hidden) / window : 0;
}

// A DDP step that is all communication: loss = sum_i <p_i, 1>, so the grads are ones and backward
// is a handful of trivial nodes.
void comm_only_step(DistributedDataParallel<Cnn>& ddp, const std::vector<torch::Tensor>& params) {
  ddp.reducer().pre_forward();
  torch::Tensor loss = torch::zeros({});
  for (const auto& p : params) loss = loss + p.sum();
  ddp.reducer().post_forward({loss});
  loss.backward();
}

// Runs command `cmd` for `iters` iterations (rank 1) or under Google Benchmark's state (rank 0).
void run(Cmd cmd, int64_t iters, benchmark::State* st) {
  const int rank = g_pg.rank();
  if (cmd == kTrainSolo) {
    if (rank != 0) return;  // rank 1 idles: 1-process baseline on the global batch
    torch::manual_seed(0);
    Cnn net;
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    auto b = make_batch(kGlobalBatch, 1);
    loop(st, iters, [&] {
      opt.zero_grad();
      torch::nn::functional::cross_entropy(net->forward(b.x), b.y).backward();
      opt.step();
    });
    return;
  }
  if (is_training(cmd)) {
    torch::manual_seed(0);
    Cnn net;
    DistributedDataParallel ddp(net, g_pg,
                                DistributedDataParallelOptions().gradient_as_bucket_view(cmd == kTrainDdpBucketView));
    if (cmd == kTrainDdpFp16) ddp.register_builtin_comm_hook(BuiltinCommHook::kFp16Compress);
    if (cmd == kTrainDdpBf16) ddp.register_builtin_comm_hook(BuiltinCommHook::kBf16Compress);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    auto b = make_batch(kGlobalBatch / g_pg.size(), 1 + rank);
    double hidden = 0;
    int64_t n = 0;
    const auto tx0 = lo_tx_bytes();
    loop(st, iters, [&] {
      opt.zero_grad();
      torch::nn::functional::cross_entropy(ddp->forward(b.x), b.y).backward();
      opt.step();
      hidden += hidden_fraction(ddp.reducer().last_timeline());
      ++n;
    });
    if (st) {
      st->counters["hidden_frac"] = hidden / std::max<int64_t>(n, 1);
      st->counters["wire_bytes_per_step"] = static_cast<double>(lo_tx_bytes() - tx0) / std::max<int64_t>(n, 1);
      g_results[fmt::format("hidden{}", static_cast<int>(cmd))] = hidden / std::max<int64_t>(n, 1);
    }
    return;
  }
  // Communication only: gradients of the CNN's shapes, a backward that costs ~nothing.
  torch::manual_seed(0);
  Cnn net;
  int64_t numel = 0;
  for (const auto& p : net->parameters()) numel += p.numel();
  if (cmd == kCommPaired) {
    // The machine is shared and noisy: alternate the two measurements within each iteration (each
    // after a barrier) and compare medians, so both see the same load.
    DistributedDataParallel ddp(net, g_pg, DistributedDataParallelOptions().broadcast_buffers(false));
    auto params = net->parameters();
    // The same step with the grads living in the buckets (no copies in or out).
    torch::manual_seed(0);
    Cnn net_view;
    DistributedDataParallel ddp_view(
        net_view, g_pg, DistributedDataParallelOptions().broadcast_buffers(false).gradient_as_bucket_view(true));
    auto params_view = net_view->parameters();
    std::vector<torch::Tensor> flat{torch::ones({numel})};
    // DDP's bucket layout as plain flat tensors: the bucketing cost alone, without autograd/hooks
    // and without the rank skew that hook timing adds.
    std::vector<torch::Tensor> bucket_buffers;
    for (const auto& idx : ddp.reducer().bucket_indices()) {
      int64_t n = 0;
      for (auto i : idx) n += params[i].numel();
      bucket_buffers.push_back(torch::ones({n}));
    }
    std::vector<double> t_flat, t_window, t_step, t_buckets, t_step_view;
    loop(st, iters, [&] {
      g_pg.c10d()->barrier()->wait();
      auto t0 = Clock::now();
      g_pg.c10d()->allreduce(flat)->wait();
      t_flat.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      g_pg.c10d()->barrier()->wait();
      t0 = Clock::now();
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (auto& b : bucket_buffers) {
        std::vector<torch::Tensor> one{b};
        works.push_back(g_pg.c10d()->allreduce(one));
      }
      for (auto& w : works) w->wait();
      t_buckets.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      g_pg.c10d()->barrier()->wait();
      t0 = Clock::now();
      comm_only_step(ddp, params);
      t_step.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      t_window.push_back(allreduce_window(ddp.reducer().last_timeline()));
      g_pg.c10d()->barrier()->wait();
      t0 = Clock::now();
      comm_only_step(ddp_view, params_view);
      t_step_view.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    });
    if (st) {
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      st->counters["flat_ms"] = 1e3 * median(t_flat);
      st->counters["ddp_allreduce_ms"] = 1e3 * median(t_window);
      st->counters["ddp_step_ms"] = 1e3 * median(t_step);
      st->counters["buckets_only_ms"] = 1e3 * median(t_buckets);
      g_results["paired_buckets"] = median(t_buckets);
      g_results["paired_flat"] = median(t_flat);
      g_results["paired_window"] = median(t_window);
      g_results["paired_step"] = median(t_step);
      g_results["paired_step_view"] = median(t_step_view);
      st->counters["ddp_step_bucket_view_ms"] = 1e3 * median(t_step_view);
    }
    return;
  }
  if (cmd == kFlatAllreduce) {
    std::vector<torch::Tensor> flat{torch::ones({numel})};
    const auto tx0 = lo_tx_bytes();
    int64_t n = 0;
    loop(st, iters, [&] {
      g_pg.c10d()->allreduce(flat)->wait();
      ++n;
    });
    if (st) {
      st->counters["MB"] = numel * 4 / 1e6;
      st->counters["wire_bytes_per_step"] = static_cast<double>(lo_tx_bytes() - tx0) / std::max<int64_t>(n, 1);
    }
    return;
  }
  DistributedDataParallel ddp(net, g_pg, DistributedDataParallelOptions().broadcast_buffers(false));
  if (cmd == kCommFp16) ddp.register_builtin_comm_hook(BuiltinCommHook::kFp16Compress);
  if (cmd == kCommBf16) ddp.register_builtin_comm_hook(BuiltinCommHook::kBf16Compress);
  auto params = net->parameters();
  const auto tx0 = lo_tx_bytes();
  int64_t n = 0;
  double window = 0;
  loop(st, iters, [&] {
    comm_only_step(ddp, params);
    window += allreduce_window(ddp.reducer().last_timeline());
    ++n;
  });
  if (st) {
    st->counters["allreduce_ms"] = 1e3 * window / std::max<int64_t>(n, 1);
    g_results[fmt::format("window{}", static_cast<int>(cmd))] = window / std::max<int64_t>(n, 1);
    st->counters["buckets"] = static_cast<double>(ddp.reducer().bucket_indices().size());
    st->counters["wire_bytes_per_step"] = static_cast<double>(lo_tx_bytes() - tx0) / std::max<int64_t>(n, 1);
  }
}

void leader(benchmark::State& st, Cmd cmd, const char* name) {
  send_command(cmd, st.max_iterations);
  const auto t0 = Clock::now();
  run(cmd, st.max_iterations, &st);
  g_results[name] = std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(st.iterations());
  if (is_training(cmd))
    st.counters["samples_per_s"] =
        benchmark::Counter(static_cast<double>(kGlobalBatch * st.iterations()), benchmark::Counter::kIsRate);
}

void follower() {
  for (;;) {
    std::vector<torch::Tensor> t{torch::zeros({2}, torch::kLong)};
    g_pg.c10d()->broadcast(t)->wait();
    const auto cmd = static_cast<Cmd>(t[0][0].item<int64_t>());
    if (cmd == kStop) return;
    run(cmd, t[0][1].item<int64_t>(), nullptr);
  }
}

void summary() {
  auto get = [](const char* k) { return g_results.count(k) ? g_results.at(k) : 0.0; };
  std::printf("\n== ampp DDP summary (same-run ratios) ==\n");
  const double solo = get("train_1proc"), ddp = get("train_ddp2"), fp16 = get("train_ddp2_fp16"),
               bf16 = get("train_ddp2_bf16");
  if (solo > 0 && ddp > 0)
    std::printf("throughput 2-proc DDP / 1-proc (global batch %ld): %.2fx\n", kGlobalBatch, solo / ddp);
  if (ddp > 0 && fp16 > 0)
    std::printf("step time fp16-hook / plain: %.2f, bf16-hook / plain: %.2f\n", fp16 / ddp, bf16 / ddp);
  const double flat = get("flat_allreduce"), plain = get("ddp_comm_plain");
  if (flat > 0 && plain > 0)
    std::printf(
        "bucketed DDP allreduce (first launch -> last completion) bandwidth / raw flat Gloo allreduce: %.1f%% "
        "(target >= 90%%); whole comm-only DDP step (incl. bucket copies, autograd): %.1f%%\n",
        100 * flat / get(fmt::format("window{}", static_cast<int>(kCommPlain)).c_str()), 100 * flat / plain);
  if (get("paired_window") > 0)
    std::printf(
        "paired medians (alternating, same load): flat %.2f ms, DDP bucketed allreduce %.2f ms -> %.1f%% of "
        "flat bandwidth; whole DDP comm-only step %.2f ms -> %.1f%%\n",
        1e3 * get("paired_flat"), 1e3 * get("paired_window"), 100 * get("paired_flat") / get("paired_window"),
        1e3 * get("paired_step"), 100 * get("paired_flat") / get("paired_step"));
  if (get("paired_buckets") > 0)
    std::printf(
        "DDP's bucket layout allreduced back to back (no autograd, no hook skew): %.2f ms -> %.1f%% of flat "
        "bandwidth\n",
        1e3 * get("paired_buckets"), 100 * get("paired_flat") / get("paired_buckets"));
  if (plain > 0)
    std::printf("comm-only step fp16 / plain: %.2f, bf16 / plain: %.2f\n", get("ddp_comm_fp16") / plain,
                get("ddp_comm_bf16") / plain);
  if (get("paired_step_view") > 0)
    std::printf("gradient_as_bucket_view, paired: comm-only DDP step %.2f ms vs %.2f ms copying -> %.2fx the time\n",
                1e3 * get("paired_step_view"), 1e3 * get("paired_step"), get("paired_step_view") / get("paired_step"));
  if (ddp > 0 && get("train_ddp2_bucket_view") > 0)
    std::printf("training step gradient_as_bucket_view / plain: %.2f\n", get("train_ddp2_bucket_view") / ddp);
  std::printf("fraction of communication hidden behind backward (plain DDP training): %.2f\n",
              get(fmt::format("hidden{}", static_cast<int>(kTrainDdp)).c_str()));
}

// Private network namespace: loopback counters then count only our two ranks' bytes.
bool enter_private_netns() {
  if (geteuid() != 0) return false;
  const std::string name = fmt::format("ampp_bench{}", getpid());
  if (std::system(("ip netns add " + name + " >/dev/null 2>&1").c_str()) != 0) return false;
  std::system(("ip -n " + name + " link set lo up").c_str());
  const int fd = open(("/run/netns/" + name).c_str(), O_RDONLY);
  const bool ok = fd >= 0 && setns(fd, CLONE_NEWNET) == 0;
  if (fd >= 0) close(fd);
  std::system(("ip netns del " + name + " >/dev/null 2>&1").c_str());  // we stay inside it
  return ok;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

#define AMPP_DDP_BENCH(name, cmd, iters) \
  BENCHMARK_CAPTURE(leader, name, cmd, #name)->Iterations(iters)->Unit(benchmark::kMillisecond)->UseRealTime()

AMPP_DDP_BENCH(train_1proc, kTrainSolo, 15);
AMPP_DDP_BENCH(train_ddp2, kTrainDdp, 15);
AMPP_DDP_BENCH(train_ddp2_fp16, kTrainDdpFp16, 15);
AMPP_DDP_BENCH(train_ddp2_bf16, kTrainDdpBf16, 15);
AMPP_DDP_BENCH(train_ddp2_bucket_view, kTrainDdpBucketView, 15);
AMPP_DDP_BENCH(flat_allreduce, kFlatAllreduce, 30);
AMPP_DDP_BENCH(ddp_comm_plain, kCommPlain, 30);
AMPP_DDP_BENCH(ddp_vs_flat_paired, kCommPaired, 41);
AMPP_DDP_BENCH(ddp_comm_fp16, kCommFp16, 30);
AMPP_DDP_BENCH(ddp_comm_bf16, kCommBf16, 30);

int main(int argc, char** argv) {
  // One compute thread per process (2 processes on 2 cores); no OpenMP/OpenBLAS oversubscription.
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  const bool netns = enter_private_netns();
  const int port = free_port();
  std::fflush(stdout);
  const pid_t child = fork();
  const int rank = child == 0 ? 1 : 0;
  at::set_num_threads(1);
  ampp::dist::set_log_level(ampp::dist::LogLevel::kWarning);
  g_pg = ampp::dist::init_process_group(ampp::dist::InitOptions()
                                            .init_method(fmt::format("tcp://127.0.0.1:{}", port))
                                            .rank(rank)
                                            .world_size(2)
                                            .timeout(std::chrono::minutes(5)));
  if (rank == 1) {
    follower();
    std::fflush(stdout);
    _exit(0);
  }
  std::printf("ampp DDP bench: 2 ranks on Gloo over loopback%s\n",
              netns ? " in a private network namespace (wire bytes = our traffic only)"
                    : " (not root: wire bytes include other loopback traffic)");
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  send_command(kStop, 0);
  summary();
  benchmark::Shutdown();
  waitpid(child, nullptr, 0);
  return 0;
}
