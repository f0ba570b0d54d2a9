// DDP synchronisation rules: no_sync, unused parameters, GradScaler skips, hung peers, construction errors.
#include "ampp_test.h"
#include "dist/ddp_test_util.h"

#include <cmath>
#include <random>

TEST(DDP, NoSyncAccumulatesLocallyThenSyncs) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    DistributedDataParallel ddp(model, pg);
    {
      auto guard = ddp.no_sync();
      auto d = rank_batch(0, rank);
      torch::mse_loss(ddp->forward(d.x), d.y).backward();
    }
    // Local only: the two ranks' gradients differ.
    EXPECT_FALSE(same_on_all_ranks(pg, flat_grads(model->parameters())));
    auto d = rank_batch(1, rank);
    torch::mse_loss(ddp->forward(d.x), d.y).backward();
    // Reference: grads of micro-batch 0 and 1 (each a union mean) accumulated in one process.
    auto ref = make_model(1);
    for (int k = 0; k < 2; ++k) {
      auto g = global_batch(k);
      torch::mse_loss(ref->forward(g.x), g.y).backward();
    }
    const auto grads = flat_grads(model->parameters());
    EXPECT_LE(rel_err(grads, flat_grads(ref->parameters())), 1e-6);
    EXPECT_TRUE(same_on_all_ranks(pg, grads));
  });
}

namespace {
// l_b is used only when `use_b` is set.
struct BranchyImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  bool use_b = false;
  BranchyImpl() {
    a = register_module("a", torch::nn::Linear(4, 2));
    b = register_module("b", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return use_b ? a(x) + b(x) : a(x); }
};
TORCH_MODULE(Branchy);
}  // namespace

// Two forwards before one backward (a GAN's D(real), then D(fake)): the error leads with that cause, not
// with unused parameters.
TEST(DDP, TwoForwardsBeforeABackwardIsNamedAsSuch) {
  on_ranks(2, [&](int, const ProcessGroup& pg) {
    torch::manual_seed(3);
    Branchy model;
    DistributedDataParallel ddp(model, pg);
    auto x = torch::ones({2, 4});
    const auto first = ddp->forward(x);
    AMPP_EXPECT_THROW_WITH(ddp->forward(x), "this forward follows another whose backward has not run");
  });
}

// Calling the wrapped module instead of DDP: PyTorch steps the unreduced gradients and the ranks drift apart.
TEST(DDP, AGradientFromAForwardAroundDdpIsRefusedNamingTheFix) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    DistributedDataParallel ddp(model, pg);
    auto d = rank_batch(0, rank);
    AMPP_EXPECT_THROW_WITH(torch::mse_loss(model->forward(d.x), d.y).backward(),
                           "the forward that produced it called the wrapped module directly");
    // After a reduced iteration too, and for a second backward over a forward DDP already reduced.
    model->zero_grad();
    const auto loss = torch::mse_loss(ddp->forward(d.x), d.y);
    loss.backward(/*gradient=*/{}, /*retain_graph=*/true);
    EXPECT_TRUE(same_on_all_ranks(pg, flat_grads(model->parameters())));
    AMPP_EXPECT_THROW_WITH(loss.backward(), "Call the DDP wrapper for every forward whose backward trains");
  });
}

// What stays allowed: local accumulation asked for with no_sync() (also for a forward around DDP, as the
// trainer's doctor replays a batch), and a no-grad forward between a forward and its backward, which
// leaves that backward's reduction armed as in PyTorch.
TEST(DDP, NoSyncAndANoGradForwardKeepGradientsWhereTheyBelong) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    DistributedDataParallel ddp(model, pg);
    auto d = rank_batch(0, rank);
    {
      auto local = ddp.no_sync();
      torch::mse_loss(model->forward(d.x), d.y).backward();
    }
    EXPECT_FALSE(same_on_all_ranks(pg, flat_grads(model->parameters())));
    model->zero_grad();
    const auto loss = torch::mse_loss(ddp->forward(d.x), d.y);
    {
      torch::NoGradGuard no_grad;
      ddp->forward(d.x);
    }
    loss.backward();
    EXPECT_TRUE(same_on_all_ranks(pg, flat_grads(model->parameters())));
  });
}

TEST(DDP, UnusedParameterIsAnErrorUnlessDetectionIsOn) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    torch::manual_seed(3);
    Branchy model;
    DistributedDataParallel ddp(model, pg);
    auto x = torch::ones({2, 4});
    ddp->forward(x).sum().backward();
    try {
      ddp->forward(x);
      ADD_FAILURE() << "expected the prior-reduction error";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("Expected to have finished reduction in the prior iteration"), std::string::npos) << msg;
      EXPECT_NE(msg.find("find_unused_parameters(true)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("b.weight"), std::string::npos) << msg;
    }
  });
  for (bool as_view : {false, true}) {
    on_ranks(2, [&](int rank, const ProcessGroup& pg) {
      torch::manual_seed(3);
      Branchy model;
      DistributedDataParallel ddp(
          model, pg, DistributedDataParallelOptions().find_unused_parameters(true).gradient_as_bucket_view(as_view));
      auto x = torch::full({2, 4}, 1.0 + rank);
      // Iteration 1: nobody uses b -> b.grad stays undefined everywhere.
      ddp->forward(x).sum().backward();
      EXPECT_FALSE(model->b->weight.grad().defined()) << "as_view " << as_view;
      // Iteration 2: only rank 0 uses b -> both get rank 0's b-gradient / 2.
      model->zero_grad();
      model->use_b = rank == 0;
      ddp->forward(x).sum().backward();
      ASSERT_TRUE(model->b->weight.grad().defined()) << "as_view " << as_view;
      // d(sum(b(x)))/dW = column sums of x = 2 rows of ones (rank 0) -> 2, averaged with 0 -> 1.
      EXPECT_TRUE(torch::allclose(model->b->weight.grad(), torch::ones({2, 4}))) << "as_view " << as_view;
      EXPECT_TRUE(same_on_all_ranks(pg, model->a->weight.grad()));
    });
  }
}

TEST(DDP, GradScalerInfOnOneRankMakesBothSkip) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    DistributedDataParallel ddp(model, pg);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    ampp::GradScaler scaler;
    // Step 0 clean: both step. Step 1: rank 1's loss is inf -> averaged grads non-finite on both.
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      auto d = rank_batch(step, rank);
      auto loss = torch::mse_loss(ddp->forward(d.x), d.y);
      if (step == 1 && rank == 1) loss = loss * std::numeric_limits<float>::infinity();
      const auto before = flat_params(model->parameters());
      scaler.scale(loss).backward();
      const bool ran = scaler.step(opt);
      scaler.update();
      EXPECT_EQ(ran, step == 0) << "step " << step;
      if (step == 1) {
        EXPECT_TRUE(torch::equal(before, flat_params(model->parameters())));
        EXPECT_EQ(scaler.get_scale(), 32768.0);
      }
      EXPECT_TRUE(same_on_all_ranks(pg, flat_params(model->parameters())));
    }
  });
}

// docs/grad_scaler.md: 1000 steps with inf/NaN losses injected at random steps and ranks, for growth
// intervals 1, 3 and 2000 (the last one backs the scale off to its 2^-126 floor and stays there).
TEST(DDP, RandomOverflowsOnRandomRanksNeverReachTheWeights) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    for (int64_t interval : {1, 3, 2000}) {
      SCOPED_TRACE("growth_interval " + std::to_string(interval));
      auto model = make_model(rank + 1);
      DistributedDataParallel ddp(model, pg);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
      ampp::GradScaler scaler(
          ampp::GradScalerOptions().growth_interval(interval).at_min_scale(ampp::MinScaleAction::kIgnore));
      std::mt19937 rng(static_cast<unsigned>(interval));  // the same draws on both ranks
      int injected = 0;
      for (int step = 0; step < 1000; ++step) {
        const bool inject = rng() % 2 == 0;
        const auto bad_rank = static_cast<int>(rng() % 2);
        const float bad = rng() % 2 == 0 ? std::numeric_limits<float>::infinity() : std::nanf("");
        injected += inject;
        opt.zero_grad();
        auto d = rank_batch(step % 8, rank);
        auto loss = torch::mse_loss(ddp->forward(d.x), d.y);
        if (inject && rank == bad_rank) loss = loss * bad;
        scaler.scale(loss).backward();
        EXPECT_EQ(scaler.step(opt), !inject) << "step " << step;
        scaler.update();
      }
      const auto params = flat_params(model->parameters());
      EXPECT_TRUE(torch::isfinite(params).all().item<bool>());
      EXPECT_EQ(scaler.skipped_steps(), injected);
      if (interval == 2000) EXPECT_EQ(scaler.get_scale(), ampp::kMinLossScale);
      EXPECT_TRUE(same_on_all_ranks(pg, params));
    }
  });
}

TEST(DDP, HungPeerFailsBackwardWithinTimeout) {
  on_ranks(
      2,
      [&](int rank, const ProcessGroup& pg) {
        auto model = make_model(1);
        DistributedDataParallel ddp(model, pg);
        if (rank == 1) {
          std::this_thread::sleep_for(3s);  // stops training
          return;
        }
        auto d = rank_batch(0, rank);
        const auto start = std::chrono::steady_clock::now();
        try {
          torch::mse_loss(ddp->forward(d.x), d.y).backward();
          ADD_FAILURE() << "backward must fail when the peer hangs";
        } catch (const std::exception& e) {
          EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
          EXPECT_NE(std::string(e.what()).find("imed out"), std::string::npos) << e.what();
        }
      },
      2s);
}

TEST(DDP, ConstructionErrors) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    torch::nn::Linear frozen(2, 2);
    for (auto& p : frozen->parameters()) p.requires_grad_(false);
    try {
      DistributedDataParallel ddp(frozen, pg);
      ADD_FAILURE();
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("DistributedDataParallel is not needed"), std::string::npos);
    }
    // Different models on the two ranks.
    torch::nn::Linear lin(2, rank == 0 ? 3 : 4);
    try {
      DistributedDataParallel ddp(lin, pg);
      ADD_FAILURE();
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("DDP expects same model across all ranks"), std::string::npos) << e.what();
    }
  });
}

// broadcast_coalesced packs a chunk's tensors of any dtypes as bytes (one collective): odd byte counts
// before wider dtypes, a non-contiguous tensor, a lone large tensor in place, and a chunk limit that
// splits the list all arrive bit for bit.
TEST(DDP, BroadcastCoalescedMovesMixedDtypesBitForBit) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto make = [](int seed) {
      torch::manual_seed(seed);
      return std::vector<torch::Tensor>{
          torch::rand({3}) > 0.5,                                  // 3 bytes: the next part starts unaligned
          torch::randn({5}, torch::kFloat64),                      // 8-byte words after them
          torch::randn({7}).to(torch::kBFloat16),                  // 14 bytes
          torch::randint(1 << 30, {}, torch::kLong),               // 0-dim counter (BatchNorm's)
          torch::randn({4, 6}).t(),                                // non-contiguous
          torch::randn({2, 3}, torch::kFloat32).to(torch::kHalf),  // fp16
          torch::randn({4096}),                                    // 16 KiB: alone in its chunk, in place
      };
    };
    auto mine = make(rank == 0 ? 1 : 2), expected = make(1);
    broadcast_coalesced(pg, mine, /*chunk_bytes=*/512, /*src=*/0);
    ASSERT_EQ(mine.size(), expected.size());
    for (size_t k = 0; k < mine.size(); ++k) {
      EXPECT_EQ(mine[k].scalar_type(), expected[k].scalar_type()) << k;
      EXPECT_EQ(mine[k].sizes(), expected[k].sizes()) << k;
      EXPECT_TRUE(torch::equal(mine[k], expected[k])) << "tensor " << k << " on rank " << rank;
    }
  });
}
