// The shared-memory allreduce among the ranks of one machine: rank-order sums on every rank, for every
// dtype and for sizes that change from call to call; DDP through it gives Gloo's gradients bit for
// bit on 2 ranks; a rank that stops is an error after the group's timeout, not a hang.
#include <ampp/dist/shared_memory_allreduce.h>

#include "dist/ddp_test_util.h"

namespace {

torch::Tensor contribution(int rank, int call, int64_t numel, torch::ScalarType dtype) {
  torch::manual_seed(1000 * call + rank);
  if (dtype == torch::kLong) return torch::randint(-1000, 1000, {numel}, torch::kLong);
  return torch::randn({numel}).to(dtype);
}

// What every rank must get: the contributions summed in rank order (16-bit floats in fp32, rounded once).
torch::Tensor rank_order_sum(int world, int call, int64_t numel, torch::ScalarType dtype) {
  const bool widen = dtype == torch::kBFloat16 || dtype == torch::kHalf;
  auto total = contribution(0, call, numel, dtype).to(widen ? torch::kFloat32 : dtype);
  for (int r = 1; r < world; ++r) total.add_(contribution(r, call, numel, dtype));
  return total.to(dtype);
}

}  // namespace

TEST(SharedMemoryAllreduce, EveryRankGetsTheRankOrderSumForEveryDtypeAndSize) {
  on_ranks(3, [&](int rank, const ProcessGroup& pg) {
    SharedMemoryAllreduce shm(pg, 64 * 1024);
    const std::vector<torch::ScalarType> dtypes{torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kHalf,
                                                torch::kLong};
    for (int call = 0; call < 40; ++call) {  // consecutive calls alternate between the two slot sets
      const auto dtype = dtypes[static_cast<size_t>(call) % dtypes.size()];
      const int64_t numel = 1 + (call * 997) % 4000;
      auto mine = contribution(rank, call, numel, dtype);
      shm.sum_(mine);
      EXPECT_TRUE(torch::equal(mine, rank_order_sum(3, call, numel, dtype))) << "call " << call << " " << dtype;
    }
    auto too_big = torch::zeros({64 * 1024});
    EXPECT_THROW(shm.sum_(too_big), c10::Error);  // a local check: no rank waits for it
  });
}

TEST(SharedMemoryAllreduce, DdpThroughItHasGloosGradientsBitForBit) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    // Small buckets: several reductions per step, each through the shared segment.
    const auto options = DistributedDataParallelOptions().bucket_cap_mb(1.0 / 1024).first_bucket_bytes(256);
    auto gloo_model = make_model(rank + 1), shm_model = make_model(rank + 1);
    DistributedDataParallel gloo(gloo_model, pg, options), shm(shm_model, pg, options);
    shm.register_comm_hook(shared_memory_allreduce_hook(pg));
    torch::optim::SGD gloo_opt(gloo_model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD shm_opt(shm_model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 4; ++step) {
      auto d = rank_batch(step, rank);
      gloo_opt.zero_grad();
      shm_opt.zero_grad();
      torch::mse_loss(gloo->forward(d.x), d.y).backward();
      torch::mse_loss(shm->forward(d.x), d.y).backward();
      EXPECT_TRUE(torch::equal(flat_grads(shm_model->parameters()), flat_grads(gloo_model->parameters())))
          << "step " << step;
      gloo_opt.step();
      shm_opt.step();
    }
    EXPECT_TRUE(torch::equal(flat_params(shm_model->parameters()), flat_params(gloo_model->parameters())));
  });
}

TEST(SharedMemoryAllreduce, ARankThatStopsIsAnErrorAfterTheTimeoutNotAHang) {
  on_ranks(
      2,
      [&](int rank, const ProcessGroup& pg) {
        SharedMemoryAllreduce shm(pg, 1024);
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(3));  // never calls sum_
          return;
        }
        auto t = torch::ones({8});
        const auto start = std::chrono::steady_clock::now();
        try {
          shm.sum_(t);
          ADD_FAILURE() << "sum_ must fail when the other rank never arrives";
        } catch (const c10::Error& e) {
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
          EXPECT_NE(std::string(e.what()).find("waited 2000 ms"), std::string::npos) << e.what();
        }
      },
      std::chrono::seconds(2));
}
