// The shared-memory allreduce among the ranks of one machine: rank-order sums on every rank, for every
// dtype and for sizes that change from call to call; its broadcast copies the root's tensors bit for bit;
// DDP through both gives Gloo's gradients and buffers bit for bit on 2 ranks; a rank that stops is an
// error after the group's timeout, not a hang.
#include <ampp/dist/shared_memory_allreduce.h>
#include <ampp/util/torch_version.h>

#include "dist/ddp_test_util.h"

#include <functional>
#include <limits>

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

// What rank `root` holds at broadcast `call`: every dtype DDP's buffers can have, odd sizes (each tensor
// starts aligned in the slot), a 0-dim counter, -0.0 and a NaN (bit-exact copies, not arithmetic).
std::vector<torch::Tensor> broadcast_values(int root, int call) {
  torch::manual_seed(100 * call + root);
  auto floats = torch::randn({37});
  floats[0] = -0.0;
  floats[1] = std::numeric_limits<float>::quiet_NaN();
  return {floats, torch::randint(1 << 30, {}, torch::kLong), torch::randn({5, 3}).to(torch::kBFloat16),
          torch::randint(2, {11}).to(torch::kBool), torch::randn({3, 4}, torch::kDouble)};
}

// FSDP's collectives (fully_shard.h): pieces of at most a slot (1 KiB here) for sizes that do and do not fill
// one, every rank's bits gathered, each rank's row summed in rank order, and the reduce-scatter equal to Gloo's
// on the same inputs.
TEST(SharedMemoryAllreduce, AllGatherAndReduceScatterMoveAnySizeInPieces) {
  on_ranks(3, [&](int rank, const ProcessGroup& pg) {
    SharedMemoryAllreduce shm(pg, 1024);
    for (int call = 0; call < 12; ++call) {
      const auto dtype = call % 3 == 0 ? torch::kBFloat16 : torch::kFloat32;
      const int64_t numel = 1 + (call * 331) % 1500;
      auto mine = contribution(rank, call, numel, dtype);
      auto all = torch::empty({3, numel}, mine.options());
      shm.all_gather_(mine, all);
      for (int r = 0; r < 3; ++r)
        EXPECT_TRUE(torch::equal(all[r], contribution(r, call, numel, dtype))) << "call " << call << " rank " << r;
      std::vector<torch::Tensor> rows;
      for (int r = 0; r < 3; ++r) rows.push_back(contribution(r, 100 + call, 3 * numel, dtype).view({3, numel})[rank]);
      auto input = contribution(rank, 100 + call, 3 * numel, dtype).view({3, numel});
      auto out = torch::empty({numel}, input.options());
      shm.reduce_scatter_sum_(input, out);
      const bool widen = dtype == torch::kBFloat16;
      auto expected = rows[0].to(widen ? torch::kFloat32 : dtype);
      for (int r = 1; r < 3; ++r) expected.add_(rows[r]);
      EXPECT_TRUE(torch::equal(out, expected.to(dtype))) << "call " << call;
    }
  });
}

TEST(SharedMemoryAllreduce, ReduceScatterIsGloosBitForBitOnTwoRanks) {
#if !AMPP_TORCH_AT_LEAST(2, 0)
  GTEST_SKIP() << "LibTorch 1.x's Gloo has no reduce_scatter to compare with";
#endif
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    SharedMemoryAllreduce shm(pg, 4096);
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      auto input = contribution(rank, 7, 2 * 3000, dtype).view({2, 3000});
      auto ours = torch::empty({3000}, input.options());
      shm.reduce_scatter_sum_(input, ours);
      std::vector<torch::Tensor> gloo{torch::empty({3000}, input.options())};
      std::vector<std::vector<torch::Tensor>> in{input.unbind(0)};
      pg.c10d()->reduce_scatter(gloo, in)->wait();
      EXPECT_TRUE(torch::equal(ours, gloo[0])) << dtype;
    }
  });
}

TEST(SharedMemoryAllreduce, BroadcastGivesEveryRankTheRootsTensorsBitForBit) {
  on_ranks(3, [&](int rank, const ProcessGroup& pg) {
    SharedMemoryAllreduce shm(pg, 4096);
    for (int call = 0; call < 30; ++call) {  // the root moves; consecutive calls alternate slot sets
      const int root = call % 3;
      auto mine = broadcast_values(rank, call);
      mine.back() = torch::zeros({4, 3}, torch::kDouble).t();  // a non-contiguous destination
      if (rank == root) mine.back().copy_(broadcast_values(root, call).back());
      shm.broadcast_(mine, root);
      const auto expected = broadcast_values(root, call);
      for (size_t i = 0; i < expected.size(); ++i) {
        const auto a = mine[i].contiguous().view({-1}).view(torch::kByte);
        const auto b = expected[i].contiguous().view({-1}).view(torch::kByte);
        EXPECT_TRUE(torch::equal(a, b)) << "call " << call << " tensor " << i;
      }
    }
    EXPECT_THROW(shm.broadcast_({torch::zeros({2048})}, 0), c10::Error);  // local checks: no rank waits
    EXPECT_THROW(shm.broadcast_({torch::zeros({2})}, 3), c10::Error);
  });
}

// Four SGD steps of a Gloo DDP run and a shared-memory one side by side on this rank's batches;
// `after_backward(step)` checks them between backward and the optimizer step.
template <typename Ddp>
void train_side_by_side(int rank, Ddp& gloo, Ddp& shm, torch::optim::Optimizer& gloo_opt,
                        torch::optim::Optimizer& shm_opt, const std::function<void(int)>& after_backward) {
  for (int step = 0; step < 4; ++step) {
    auto d = rank_batch(step, rank);
    gloo_opt.zero_grad();
    shm_opt.zero_grad();
    torch::mse_loss(gloo->forward(d.x), d.y).backward();
    torch::mse_loss(shm->forward(d.x), d.y).backward();
    after_backward(step);
    gloo_opt.step();
    shm_opt.step();
  }
}

TEST(SharedMemoryAllreduce, DdpWithItsBufferBroadcastHasGloosModelBitForBit) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    torch::manual_seed(rank + 1);
    BnNet gloo_model;
    torch::manual_seed(rank + 1);
    BnNet shm_model;
    DistributedDataParallel gloo(gloo_model, pg), shm(shm_model, pg);
    shm.register_comm_hook(shared_memory_allreduce_hook(pg));
    shm.register_buffer_broadcast(shared_memory_buffer_broadcast(pg));
    torch::optim::SGD gloo_opt(gloo_model->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD shm_opt(shm_model->parameters(), torch::optim::SGDOptions(0.1));
    // Each rank's batch moves its own statistics; rank 1 starts each forward from rank 0's (without the
    // broadcast its buffers would differ from the Gloo run's).
    train_side_by_side(rank, gloo, shm, gloo_opt, shm_opt, [](int) {});
    EXPECT_TRUE(torch::equal(flat_params(shm_model->parameters()), flat_params(gloo_model->parameters())));
    EXPECT_TRUE(torch::equal(shm_model->bn->running_mean, gloo_model->bn->running_mean));
    EXPECT_TRUE(torch::equal(shm_model->bn->running_var, gloo_model->bn->running_var));
    EXPECT_EQ(shm_model->bn->num_batches_tracked.item<int64_t>(), 4);
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
    train_side_by_side(rank, gloo, shm, gloo_opt, shm_opt, [&](int step) {
      EXPECT_TRUE(torch::equal(flat_grads(shm_model->parameters()), flat_grads(gloo_model->parameters())))
          << "step " << step;
    });
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

TEST(SharedMemoryAllreduce, AnEmptyOrASecondBufferBroadcastIsAClearError) {
  on_ranks(1, [&](int, const ProcessGroup& pg) {
    BnNet model;
    DistributedDataParallel ddp(model, pg);
    auto message = [&](BufferBroadcast broadcast) -> std::string {
      try {
        ddp.register_buffer_broadcast(std::move(broadcast));
      } catch (const c10::Error& e) {
        return e.what_without_backtrace();
      }
      return "no error";
    };
    EXPECT_NE(message({}).find("register_buffer_broadcast got an empty function"), std::string::npos);
    EXPECT_EQ(message(shared_memory_buffer_broadcast(pg)), "no error");
    EXPECT_NE(message(shared_memory_buffer_broadcast(pg)).find("can only be called once"), std::string::npos);
  });
}
