// ampp::dist::join: ranks with different numbers of batches all finish; the gradients of every step
// are those of the active ranks (zeros from the joined one, divided by the whole world as PyTorch's
// default); every rank ends with the model of a rank that was active to the end.
#include "dist/ddp_test_util.h"

#include <ampp/dist/join.h>
#include <ampp/dist/sync_batch_norm.h>

#include "ampp_test.h"

namespace ampp_test {
namespace {

// One process's view of the whole run: per step, the gradient DDP must produce, where rank r takes
// part while step < batches[r] (a joined rank contributes zeros; the sum is divided by 2).
struct Reference {
  std::vector<torch::Tensor> grads;
  torch::Tensor final_params;
};
Reference reference_run(const std::vector<int>& batches) {
  auto model = make_model(1);  // rank 0's seed: what DDP broadcast
  torch::optim::SGD opt(model->parameters(), 0.1);
  Reference ref;
  for (int step = 0; step < std::max(batches[0], batches[1]); ++step) {
    opt.zero_grad();
    for (int r = 0; r < 2; ++r) {
      if (step >= batches[static_cast<size_t>(r)]) continue;
      const auto b = rank_batch(step, r);
      (torch::mse_loss(model->forward(b.x), b.y) / 2).backward();
    }
    ref.grads.push_back(flat_grads(model->parameters()));
    opt.step();
  }
  ref.final_params = flat_params(model->parameters());
  return ref;
}

void check_uneven_batches(const DistributedDataParallelOptions& options, const std::vector<int>& batches) {
  const Reference ref = reference_run(batches);
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    DistributedDataParallel<Mlp> ddp(model, pg, options);
    torch::optim::SGD opt(ddp.parameters(), 0.1);
    ampp::dist::join(ddp.joinable(), [&] {
      for (int step = 0; step < batches[static_cast<size_t>(rank)]; ++step) {
        opt.zero_grad();
        const auto b = rank_batch(step, rank);
        torch::mse_loss(ddp.forward(b.x), b.y).backward();
        EXPECT_LT(rel_err(flat_grads(ddp.parameters()), ref.grads[static_cast<size_t>(step)]), 1e-5) << "step " << step;
        opt.step();
      }
    });
    EXPECT_TRUE(same_on_all_ranks(pg, flat_params(ddp.parameters())));
    EXPECT_LT(rel_err(flat_params(ddp.parameters()), ref.final_params), 1e-5);
  });
}

// Small buckets (several per backward, rebuilt after the first) so the shadow must follow their order.
DistributedDataParallelOptions small_buckets() { return DistributedDataParallelOptions().bucket_cap_mb(0.004); }

TEST(Join, RanksWithThreeAndFiveBatchesFinishWithTheActiveRanksGradients) {
  check_uneven_batches(small_buckets(), {3, 5});
}

TEST(Join, ARankThatJoinsBeforeTheBucketRebuildShadowsIt) { check_uneven_batches(small_buckets(), {5, 1}); }

TEST(Join, FindUnusedParametersShadowsItsExtraAllreduce) {
  check_uneven_batches(small_buckets().find_unused_parameters(true), {2, 4});
}

// Buffers are broadcast from the highest active rank, bucket reductions go through the comm hook; every
// rank ends with the same parameters, running statistics and buckets.
TEST(Join, BuffersAndCommHooksAreShadowedAndEveryRankEndsAlike) {
  on_ranks(2, [](int rank, const ProcessGroup& pg) {
    torch::manual_seed(rank + 1);
    BnNet net;
    DistributedDataParallel<BnNet> ddp(net, pg, small_buckets());
    ddp.register_builtin_comm_hook(ampp::dist::BuiltinCommHook::kFp16Compress);
    torch::optim::SGD opt(ddp.parameters(), 0.1);
    ampp::dist::join(ddp.joinable(), [&] {
      for (int step = 0; step < (rank == 0 ? 2 : 6); ++step) {
        opt.zero_grad();
        const auto b = rank_batch(step, rank);
        torch::mse_loss(ddp.forward(b.x), b.y).backward();
        opt.step();
      }
    });
    EXPECT_TRUE(same_on_all_ranks(pg, flat_params(ddp.parameters())));
    EXPECT_TRUE(same_on_all_ranks(pg, net->bn->running_mean));
    EXPECT_TRUE(same_on_all_ranks(pg, net->bn->num_batches_tracked));
    EXPECT_EQ(net->bn->num_batches_tracked.item<int64_t>(), 6) << "the model of the rank active to the end";
    std::vector<int64_t> order;
    for (const auto& bucket : ddp.reducer().bucket_indices()) order.insert(order.end(), bucket.begin(), bucket.end());
    EXPECT_TRUE(same_on_all_ranks(pg, torch::tensor(order)));
  });
}

TEST(Join, ThrowOnEarlyTerminationFailsEveryRankSayingWhy) {
  on_ranks(2, [](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    DistributedDataParallel<Mlp> ddp(model, pg);
    const std::string error = error_of([&] {
      ampp::dist::join(
          ddp.joinable(),
          [&] {
            for (int step = 0; step < (rank == 0 ? 2 : 4); ++step) {
              const auto b = rank_batch(step, rank);
              torch::mse_loss(ddp.forward(b.x), b.y).backward();
            }
          },
          ampp::dist::JoinOptions().throw_on_early_termination(true));
    });
    if (rank == 0) {
      EXPECT_NE(error.find("rank 0 exhausted its inputs"), std::string::npos) << error;
    } else {
      EXPECT_NE(error.find("detected at least one rank that exhausted its inputs"), std::string::npos) << error;
    }
  });
}

TEST(Join, ASyncBatchNormModelIsAClearError) {
  on_ranks(2, [](int, const ProcessGroup& pg) {
    auto net = torch::nn::Sequential(torch::nn::Linear(8, 4), ampp::dist::SyncBatchNorm(4));
    DistributedDataParallel<torch::nn::Sequential> ddp(net, pg);
    const std::string error = error_of([&] { ampp::dist::join(ddp.joinable(), [] {}); });
    EXPECT_NE(error.find("cannot shadow SyncBatchNorm's collectives"), std::string::npos) << error;
    pg.barrier();  // keeps rank 0 (the rendezvous store) alive until rank 1 has joined
  });
}

}  // namespace
}  // namespace ampp_test
