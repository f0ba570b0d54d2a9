// ampp::dist::SyncBatchNorm on Gloo (CPU): 2 and 3 ranks with unequal (and empty) batches give what
// one process gives on the concatenated batch; gradients agree with finite differences; eval() and
// one rank need no communication; O2 keeps it in FP32.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <ampp/amp/initialize.h>
#include <ampp/dist/sync_batch_norm.h>

#include "ampp_test.h"
#include "multiprocess.h"

namespace ampp_test {
namespace {

using ampp::dist::SyncBatchNorm;
using ampp::dist::SyncBatchNormOptions;

constexpr int64_t kChannels = 3;

// The whole batch (every rank builds the same one) and the rows of `rank` when split by `sizes`.
torch::Tensor whole_batch(const std::vector<int64_t>& sizes, torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(42);
  const int64_t n = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  return (torch::randn({n, kChannels, 4, 5}, torch::kDouble) * 3 + 1.5).to(dtype);
}
torch::Tensor rows_of(const torch::Tensor& whole, const std::vector<int64_t>& sizes, int rank) {
  const int64_t start = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
  return whole.narrow(0, start, sizes[static_cast<size_t>(rank)]);
}

// Every rank's copy of `t` is bitwise the same.
void expect_same_on_every_rank(const ProcessGroup& group, const torch::Tensor& t, const char* what) {
  std::vector<std::vector<torch::Tensor>> all{std::vector<torch::Tensor>(static_cast<size_t>(group.size()))};
  for (auto& a : all[0]) a = torch::empty_like(t);
  std::vector<torch::Tensor> mine{t.clone()};
  group.c10d()->allgather(all, mine)->wait();
  for (const auto& other : all[0]) EXPECT_TRUE(other.equal(t)) << what << " differs between ranks";
}

torch::Tensor allreduce_sum(const ProcessGroup& group, const torch::Tensor& t) {
  std::vector<torch::Tensor> v{t.clone()};
  group.c10d()->allreduce(v)->wait();
  return v[0];
}

// Two training steps of SyncBatchNorm on this rank's rows vs BatchNorm2d on the whole batch.
void check_against_one_process(int rank, const ProcessGroup& group, const std::vector<int64_t>& sizes) {
  const auto whole = whole_batch(sizes);
  const auto upstream = torch::randn_like(whole);  // d(loss)/d(output)
  torch::nn::BatchNorm2d reference(kChannels);
  SyncBatchNorm sync(kChannels);
  for (auto* p : {&reference->weight, &reference->bias}) p->data().uniform_(0.5, 1.5);
  sync->weight.data().copy_(reference->weight);
  sync->bias.data().copy_(reference->bias);
  for (int step = 0; step < 2; ++step) {
    auto x_all = whole.clone().requires_grad_(true);
    auto y_all = reference->forward(x_all);
    (y_all * upstream).sum().backward();
    auto x = rows_of(whole, sizes, rank).clone().requires_grad_(true);
    auto y = sync->forward(x);
    (y * rows_of(upstream, sizes, rank)).sum().backward();

    EXPECT_TRUE(torch::allclose(y, rows_of(y_all, sizes, rank), 1e-5, 1e-5)) << "output, step " << step;
    EXPECT_TRUE(torch::allclose(x.grad(), rows_of(x_all.grad(), sizes, rank), 1e-5, 1e-5)) << "input grad";
    // Weight and bias gradients stay local (DDP averages them): their sum is the whole batch's.
    EXPECT_TRUE(torch::allclose(allreduce_sum(group, sync->weight.grad()), reference->weight.grad(), 1e-4, 1e-5));
    EXPECT_TRUE(torch::allclose(allreduce_sum(group, sync->bias.grad()), reference->bias.grad(), 1e-4, 1e-5));
    EXPECT_TRUE(torch::allclose(sync->running_mean, reference->running_mean, 1e-6, 1e-6)) << "step " << step;
    EXPECT_TRUE(torch::allclose(sync->running_var, reference->running_var, 1e-6, 1e-6)) << "step " << step;
    EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), step + 1);
    expect_same_on_every_rank(group, sync->running_mean, "running_mean");
    expect_same_on_every_rank(group, sync->running_var, "running_var");
    for (auto* p : {&reference->weight, &reference->bias, &sync->weight, &sync->bias}) p->mutable_grad().zero_();
  }
}

TEST(SyncBatchNorm, TwoRanksWithUnequalBatchesEqualOneProcessOnTheWholeBatch) {
  on_ranks(2, [](int rank, const ProcessGroup& group) { check_against_one_process(rank, group, {3, 5}); });
}

TEST(SyncBatchNorm, ThreeRanksOneOfThemEmptyEqualOneProcessOnTheWholeBatch) {
  on_ranks(3, [](int rank, const ProcessGroup& group) { check_against_one_process(rank, group, {2, 0, 4}); });
}

// A channels_last batch stays channels_last through forward and backward (no NCHW copy; issue 52, defect 7)
// and gets the NCHW batch's values.
TEST(SyncBatchNorm, ChannelsLastStaysChannelsLastWithTheSameValues) {
  const std::vector<int64_t> sizes{3, 5};
  on_ranks(2, [&](int rank, const ProcessGroup&) {
    const auto rows = rows_of(whole_batch(sizes), sizes, rank);
    const auto upstream = torch::randn_like(rows);
    SyncBatchNorm nchw(kChannels), last(kChannels);
    auto x = rows.clone().requires_grad_(true);
    auto x_last = rows.contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(true);
    const auto y = nchw->forward(x), y_last = last->forward(x_last);
    (y * upstream).sum().backward();
    (y_last * upstream).sum().backward();
    EXPECT_TRUE(y_last.is_contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_TRUE(x_last.grad().is_contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_TRUE(torch::allclose(y_last, y, 1e-6, 1e-6));
    EXPECT_TRUE(torch::allclose(x_last.grad(), x.grad(), 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(last->weight.grad(), nchw->weight.grad(), 1e-5, 1e-6));
  });
}

// bf16 activations into an FP32 SyncBatchNorm (O2's layout): bf16 out, float32 statistics.
TEST(SyncBatchNorm, Bf16InputsAreNormalisedWithFloat32Statistics) {
  const std::vector<int64_t> sizes{4, 2};
  on_ranks(2, [&](int rank, const ProcessGroup&) {
    const auto whole = whole_batch(sizes, torch::kBFloat16);
    torch::nn::BatchNorm2d reference(kChannels);
    SyncBatchNorm sync(kChannels);
    const auto expected = reference->forward(whole.to(torch::kFloat));
    const auto y = sync->forward(rows_of(whole, sizes, rank));
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::allclose(y.to(torch::kFloat),
                                rows_of(expected, sizes, rank).to(torch::kBFloat16).to(torch::kFloat), 0, 1e-2));
    EXPECT_TRUE(torch::allclose(sync->running_var, reference->running_var, 1e-5, 1e-6));
  });
}

// The global loss sum_r sum(y_r * g_r) as every rank sees it; rank `bumped` adds `h` to element `i`.
double global_loss(const ProcessGroup& group, SyncBatchNorm& bn, torch::Tensor x, const torch::Tensor& g, int rank,
                   int bumped, int64_t i, double h) {
  torch::NoGradGuard no_grad;
  if (rank == bumped) {
    x = x.clone();
    x.view(-1)[i] += h;
  }
  return allreduce_sum(group, (bn->forward(x) * g).sum()).item<double>();
}

TEST(SyncBatchNorm, GradientsAgreeWithFiniteDifferences) {
  const std::vector<int64_t> sizes{2, 3};
  on_ranks(2, [&](int rank, const ProcessGroup& group) {
    torch::manual_seed(7);
    const auto whole = torch::randn({5, 2, 3}, torch::kDouble);
    const auto upstream = torch::randn_like(whole);
    SyncBatchNorm bn(SyncBatchNormOptions(2).track_running_stats(false));
    for (auto* p : {&bn->weight, &bn->bias}) p->set_data(p->data().to(torch::kDouble));  // (no buffers to cast)
    bn->weight.data().uniform_(0.5, 1.5);
    bn->bias.data().uniform_(-1, 1);
    const auto x = rows_of(whole, sizes, rank).clone().requires_grad_(true);
    const auto g = rows_of(upstream, sizes, rank);
    (bn->forward(x) * g).sum().backward();
    const double h = 1e-6;
    for (int bumped = 0; bumped < 2; ++bumped) {
      for (int64_t i : {0, 4, 7, 11}) {
        const double numeric = (global_loss(group, bn, x.detach(), g, rank, bumped, i, h) -
                                global_loss(group, bn, x.detach(), g, rank, bumped, i, -h)) /
                               (2 * h);
        if (rank == bumped) EXPECT_NEAR(x.grad().view(-1)[i].item<double>(), numeric, 1e-6) << "element " << i;
      }
    }
    // d loss / d weight[c] is the sum over ranks of the local gradients.
    const auto grad_weight = allreduce_sum(group, bn->weight.grad());
    for (int64_t c = 0; c < 2; ++c) {
      const auto w = bn->weight.data()[c].item<double>();
      bn->weight.data()[c] = w + h;
      const double up = global_loss(group, bn, x.detach(), g, rank, -1, 0, 0);
      bn->weight.data()[c] = w - h;
      const double down = global_loss(group, bn, x.detach(), g, rank, -1, 0, 0);
      bn->weight.data()[c] = w;
      EXPECT_NEAR(grad_weight[c].item<double>(), (up - down) / (2 * h), 1e-6) << "weight " << c;
    }
  });
}

TEST(SyncBatchNorm, EvalUsesRunningStatisticsWithoutCommunication) {
  on_ranks(2, [](int rank, const ProcessGroup& group) {
    // Rank 1 never calls forward (rank 0 must not wait for it); the final barrier only keeps rank 0,
    // which hosts the rendezvous store, alive until rank 1 has joined the group.
    if (rank == 1) return group.barrier();
    SyncBatchNorm sync(kChannels);
    torch::nn::BatchNorm2d reference(kChannels);
    for (auto* bn : {&sync->running_mean, &reference->running_mean}) bn->fill_(0.5);
    sync->eval();
    reference->eval();
    const auto x = torch::randn({2, kChannels, 3, 3});
    EXPECT_TRUE(sync->forward(x).equal(reference->forward(x)));
    group.barrier();
  });
}

TEST(SyncBatchNorm, UnderALocalGuardOneRankTrainsAloneWithItsOwnStatistics) {
  on_ranks(2, [](int rank, const ProcessGroup& group) {
    EXPECT_TRUE(SyncBatchNorm(kChannels)->sync_group());
    if (rank == 1) return group.barrier();  // never calls forward: rank 0 must not wait for it
    ampp::dist::LocalBatchNormGuard local;
    SyncBatchNorm sync(kChannels);
    EXPECT_FALSE(sync->sync_group());
    torch::nn::BatchNorm2d reference(kChannels);
    const auto x = torch::randn({2, kChannels, 3, 3});
    EXPECT_TRUE(sync->forward(x).equal(reference->forward(x)));
    group.barrier();  // keeps rank 0 (the rendezvous store) alive until rank 1 has joined
  });
}

TEST(SyncBatchNorm, WithoutAProcessGroupItIsBatchNorm) {
  ASSERT_FALSE(ampp::dist::is_initialized());
  SyncBatchNorm sync(SyncBatchNormOptions(kChannels).momentum(std::nullopt));
  torch::nn::BatchNorm1d reference(torch::nn::BatchNormOptions(kChannels).momentum(c10::nullopt));
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({6, kChannels});
    EXPECT_TRUE(sync->forward(x).equal(reference->forward(x)));
  }
  EXPECT_TRUE(sync->running_var.equal(reference->running_var));
  EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), 3);
}

TEST(SyncBatchNorm, OneValuePerChannelOverAllRanksFailsOnEveryRankWithTheCounts) {
  on_ranks(2, [](int rank, const ProcessGroup&) {
    SyncBatchNorm sync(kChannels);
    const auto x = torch::randn({rank == 0 ? 1 : 0, kChannels});
    const std::string error = error_of([&] { sync->forward(x); });
    EXPECT_NE(error.find("expected more than 1 value per channel over all ranks when training, got 1"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("on each rank: 1, 0"), std::string::npos) << error;
  });
}

TEST(SyncBatchNorm, BadInputNamesTheProblem) {
  SyncBatchNorm sync(kChannels);
  EXPECT_NE(error_of([&] { sync->forward(torch::randn({4})); }).find("expected at least 2D input (got 1D input)"),
            std::string::npos);
  on_ranks(2, [](int, const ProcessGroup& group) {
    SyncBatchNorm bn(kChannels);
    const std::string error = error_of([&] { bn->forward(torch::randn({4, 5})); });
    EXPECT_NE(error.find("input has 5 channels (dimension 1) but the module was built for 3"), std::string::npos)
        << error;
    group.barrier();  // keeps rank 0 (the rendezvous store) alive until rank 1 has joined
  });
}

TEST(SyncBatchNorm, O2KeepsItInFloat32LikeBatchNorm) {
  auto net = torch::nn::Sequential(torch::nn::Linear(4, kChannels), SyncBatchNorm(kChannels));
  torch::optim::SGD opt(net->parameters(), 0.1);
  ampp::initialize(net.ptr(), opt, ampp::Properties("O2").verbosity(0));
  EXPECT_EQ(net[0]->as<torch::nn::LinearImpl>()->weight.scalar_type(), torch::kBFloat16);
  auto* bn = net[1]->as<ampp::dist::SyncBatchNormImpl>();
  EXPECT_EQ(bn->weight.scalar_type(), torch::kFloat);
  EXPECT_EQ(bn->running_var.scalar_type(), torch::kFloat);
}

}  // namespace
}  // namespace ampp_test
