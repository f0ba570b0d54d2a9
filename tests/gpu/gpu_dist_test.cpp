// ampp's data parallelism on a real GPU, where one GPU allows it: world size 1 over NCCL (and over Gloo
// on CUDA tensors). DDP, ZeRO-1, FSDP and SyncBatchNorm must then train exactly as the same model without them
// (a sum over one rank is the value itself), so these compare bit for bit with plain training on the GPU,
// under cuDNN's deterministic algorithms (first: plain training twice is the same bits).
// Two ranks share the one GPU over Gloo (NCCL refuses two ranks on one GPU), each a process of its own:
// there SyncBatchNorm, ZeRO and DDP really combine two ranks' batches.
#include <ampp/dist/ddp.h>
#include <ampp/dist/fully_shard.h>
#include <ampp/dist/process_group.h>
#include <ampp/dist/sync_batch_norm.h>
#include <ampp/dist/zero_redundancy_optimizer.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace {

// The default group for one test: world size 1 on `backend`. It is process-wide: ended before the next
// backend's, and before exit (an NCCL group destroyed after CUDA has unloaded aborts the process).
class OneRankGroup {
 public:
  explicit OneRankGroup(const std::string& backend)
      : pg_(ampp::dist::init_process_group(ampp::dist::InitOptions()
                                               .backend(backend)
                                               .init_method("tcp://127.0.0.1:" + std::to_string(ampp_test::free_port()))
                                               .rank(0)
                                               .world_size(1))) {}
  ~OneRankGroup() { ampp::dist::destroy_process_group(); }
  const ampp::dist::ProcessGroup& pg() const { return pg_; }

 private:
  ampp::dist::ProcessGroup pg_;
};

torch::nn::Sequential small_net(bool sync_batch_norm) {
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
  if (sync_batch_norm)
    net->push_back(ampp::dist::SyncBatchNorm(8));
  else
    net->push_back(torch::nn::BatchNorm2d(8));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Flatten());
  net->push_back(torch::nn::Linear(8 * 8 * 8, 10));
  net->to(torch::kCUDA);
  return net;
}

std::vector<torch::Tensor> batch(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({16, 3, 8, 8}).to(torch::kCUDA), torch::randint(0, 10, {16}).to(torch::kCUDA)};
}

// Four SGD steps through `forward`, with `opt`.
template <typename Forward>
void four_steps(torch::optim::Optimizer& opt, Forward forward) {
  for (int step = 0; step < 4; ++step) {
    const auto b = batch(step);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(forward(b[0]), b[1]).backward();
    opt.step();
  }
}

std::vector<torch::Tensor> parameters_on_host(const torch::nn::Sequential& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().cpu());
  return out;
}

// Four SGD steps of `net` through `forward`, with `opt`; the parameters after them.
template <typename Forward>
std::vector<torch::Tensor> train4(torch::nn::Sequential& net, torch::optim::Optimizer& opt, Forward forward) {
  ampp_gpu_test::DeterministicCudnn same_bits;
  four_steps(opt, forward);
  return parameters_on_host(net);
}

std::vector<torch::Tensor> plain_training() {
  ampp_gpu_test::DeterministicCudnn same_bits;
  auto net = small_net(false);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  return train4(net, opt, [&](const torch::Tensor& x) { return net->forward(x); });
}

void expect_same(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << what << ": parameter " << i;
}

}  // namespace

// The reference of every test below: the same bits each time it runs.
TEST(GpuDist, PlainTrainingIsRepeatableBitForBit) {
  AMPP_REQUIRE_GPU();
  expect_same(plain_training(), plain_training(), "plain training run twice");
}

// init_process_group("nccl") at world size 1 reduces CUDA tensors; Gloo reduces them too.
TEST(GpuDist, NcclAndGlooReduceCudaTensorsAtWorldSizeOne) {
  AMPP_REQUIRE_GPU();
  for (const std::string backend : {"nccl", "gloo"}) {
    OneRankGroup group(backend);
    std::vector<torch::Tensor> t = {torch::arange(6, torch::TensorOptions(torch::kCUDA).dtype(torch::kFloat))};
    group.pg().c10d()->allreduce(t)->wait();
    EXPECT_TRUE(torch::equal(t[0].cpu(), torch::arange(6, torch::kFloat))) << backend;
  }
}

// DDP's own bookkeeping travels too: the model check at construction, the bucket order after the first
// backward and, with find_unused_parameters, the used-parameter flags (on the GPU for NCCL, which takes
// CUDA tensors only: src/ampp/dist/control_tensors.h).
TEST(GpuDist, DdpAtWorldSizeOneTrainsAsPlainTrainingOverNcclAndGloo) {
  AMPP_REQUIRE_GPU();
  const auto want = plain_training();
  for (const std::string backend : {"nccl", "gloo"}) {
    for (const bool find_unused : {false, true}) {
      OneRankGroup group(backend);
      auto net = small_net(false);
      ampp::dist::DistributedDataParallel ddp(
          net, group.pg(), ampp::dist::DistributedDataParallelOptions().find_unused_parameters(find_unused));
      torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      expect_same(train4(net, opt, [&](const torch::Tensor& x) { return ddp->forward(x); }), want,
                  "DDP " + backend + (find_unused ? ", find_unused_parameters" : ""));
    }
  }
}

// `ampp train`'s arrangement with one GPU per worker: the default group Gloo (the host's sums), DDP's
// gradients through an NCCL subgroup of it (new_group's backend argument).
TEST(GpuDist, DdpOverAnNcclSubgroupOfAGlooGroupTrainsAsPlainTraining) {
  AMPP_REQUIRE_GPU();
  const auto want = plain_training();
  OneRankGroup group("gloo");
  const auto nccl = ampp::dist::new_group(group.pg(), {0}, "nccl");
  EXPECT_EQ(nccl.backend(), "nccl");
  auto net = small_net(false);
  ampp::dist::DistributedDataParallel ddp(net, nccl);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  expect_same(train4(net, opt, [&](const torch::Tensor& x) { return ddp->forward(x); }), want, "DDP over NCCL");
}

TEST(GpuDist, ZeroAndSyncBatchNormAtWorldSizeOneOverNcclTrainAsPlainTraining) {
  AMPP_REQUIRE_GPU();
  const auto want = plain_training();
  OneRankGroup group("nccl");
  {
    auto net = small_net(false);
    auto zero = ampp::dist::ZeroRedundancyOptimizer::of<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9),
        ampp::dist::ZeroRedundancyOptimizerOptions().process_group(group.pg()));
    expect_same(train4(net, zero, [&](const torch::Tensor& x) { return net->forward(x); }), want, "ZeRO-1");
    zero.consolidate_state_dict(0);  // the shards' bytes gathered through NCCL, as CUDA tensors
    ASSERT_NE(zero.consolidated(), nullptr);
    EXPECT_EQ(zero.consolidated()->state().size(), net->parameters().size()) << "a momentum buffer per parameter";
  }
  {
    auto net = small_net(true);  // SyncBatchNorm in place of BatchNorm2d, the same parameters
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    const auto got = train4(net, opt, [&](const torch::Tensor& x) { return net->forward(x); });
    ASSERT_EQ(got.size(), want.size());
    // Its statistics are summed through the group (mean and variance from sums): equal within rounding.
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-5)) << i;
  }
}

// FSDP on CUDA tensors: the shards, the gathered parameters' storage (the CUDA allocator's) and the gradients
// stay on the GPU; at world size 1 a gather is a copy and a reduce-scatter the gradient itself.
TEST(GpuDist, FsdpAtWorldSizeOneTrainsAsPlainTrainingOverNcclAndGloo) {
  AMPP_REQUIRE_GPU();
  const auto want = plain_training();
  for (const std::string backend : {"nccl", "gloo"}) {
    OneRankGroup group(backend);
    auto net = small_net(false);
    ampp::dist::FullyShardedDataParallel fsdp(net.ptr(), {}, ampp::dist::FullyShardOptions().process_group(group.pg()));
    for (const auto& shard : fsdp.parameters()) ASSERT_TRUE(shard.is_cuda()) << backend;
    torch::optim::SGD opt(fsdp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    ampp_gpu_test::DeterministicCudnn same_bits;
    four_steps(opt, [&](const torch::Tensor& x) { return fsdp.forward<torch::nn::SequentialImpl>(x); });
    fsdp.unshard();  // the whole model back in the module (which holds no memory between steps), to compare
    expect_same(parameters_on_host(net), want, "FSDP " + backend);
  }
}

namespace {

// The test `name` of this binary run again in `world` fresh processes (CUDA does not survive a fork), each
// with AMPP_GPU_DIST_RANK and AMPP_GPU_DIST_PORT set; true when every one exits 0.
bool run_as_ranks(const std::string& name, int world) {
  const int port = ampp_test::free_port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> env_strings{"AMPP_GPU_DIST_RANK=" + std::to_string(rank),
                                         "AMPP_GPU_DIST_PORT=" + std::to_string(port)};
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
    std::vector<char*> env;
    for (auto& e : env_strings) env.push_back(e.data());
    env.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=" + name;
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_t pid = 0;
    if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, env.data()) != 0) return false;
    pids.push_back(pid);
  }
  bool ok = true;
  for (const pid_t pid : pids) {
    int status = 0;
    ok = waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 && ok;
  }
  return ok;
}

// Rank `rank` of 2: DDP over Gloo with SyncBatchNorm and ZeRO-1 (SGD), each on its half of every batch.
std::vector<torch::Tensor> two_rank_training(int rank, int port) {
  auto pg = ampp::dist::init_process_group(ampp::dist::InitOptions()
                                               .backend("gloo")
                                               .init_method("tcp://127.0.0.1:" + std::to_string(port))
                                               .rank(rank)
                                               .world_size(2));
  auto net = small_net(true);
  ampp::dist::DistributedDataParallel ddp(net, pg);
  auto zero = ampp::dist::ZeroRedundancyOptimizer::of<torch::optim::SGD>(
      net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9),
      ampp::dist::ZeroRedundancyOptimizerOptions().process_group(pg));
  ampp_gpu_test::DeterministicCudnn same_bits;
  for (int step = 0; step < 4; ++step) {
    const auto b = batch(step);
    zero.zero_grad();
    const auto x = b[0].chunk(2)[static_cast<size_t>(rank)], y = b[1].chunk(2)[static_cast<size_t>(rank)];
    torch::nn::functional::cross_entropy(ddp->forward(x), y).backward();
    zero.step();
  }
  auto out = parameters_on_host(net);
  ampp::dist::destroy_process_group();
  return out;
}

}  // namespace

// Two processes on one GPU over Gloo: DDP averages two ranks' gradients, SyncBatchNorm pools their batch
// statistics and ZeRO steps each rank's shard and broadcasts it, so together they train as one process on
// the whole batch (within float32 rounding: the sums run in another order). At world size 1 all three are
// identities (issue 52: the GPU tests must see what they target).
TEST(GpuDist, TwoRanksOnOneGpuOverGlooTrainAsOneProcessOnTheWholeBatch) {
  AMPP_REQUIRE_GPU();
  if (const char* rank = std::getenv("AMPP_GPU_DIST_RANK")) {
    const auto got = two_rank_training(std::atoi(rank), std::atoi(std::getenv("AMPP_GPU_DIST_PORT")));
    const auto want = plain_training();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-5)) << i;
    return;
  }
  EXPECT_TRUE(run_as_ranks("GpuDist.TwoRanksOnOneGpuOverGlooTrainAsOneProcessOnTheWholeBatch", 2))
      << "a rank failed (its output above)";
}
