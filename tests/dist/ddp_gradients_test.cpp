// DDP gradients and parameters: equal to one process training on the union of the ranks' batches.
#include "dist/ddp_test_util.h"

TEST(BucketAssignment, ClosesAtLimitAndAdvancesLimits) {
  // Bytes: 40, 80, 120, 160 (float). Visit in reverse; limits [100, 200]:
  // [3] (160 >= 100) closes the first bucket; then [2, 1] (120 + 80 = 200 >= 200); leftover [0].
  std::vector<torch::Tensor> t{torch::zeros({10}), torch::zeros({20}), torch::zeros({30}), torch::zeros({40})};
  const auto b = compute_bucket_assignment_by_size(t, {100, 200}, {3, 2, 1, 0});
  EXPECT_EQ(b, (std::vector<std::vector<size_t>>{{3}, {2, 1}, {0}}));
  // A huge cap: one bucket per dtype, a double tensor never shares a bucket with floats.
  t.push_back(torch::zeros({5}, torch::kDouble));
  const auto c = compute_bucket_assignment_by_size(t, {1 << 30}, {4, 3, 2, 1, 0});
  EXPECT_EQ(c, (std::vector<std::vector<size_t>>{{4}, {3, 2, 1, 0}}));
}

TEST(DDP, SingleRankWorldMatchesPlainTraining) {
  on_ranks(1, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(1);
    DistributedDataParallel ddp(model, pg);
    auto d = global_batch(0);
    torch::mse_loss(ddp->forward(d.x), d.y).backward();
    EXPECT_LE(rel_err(flat_grads(model->parameters()), reference_grads(0, 0)), 1e-6);
  });
}

TEST(DDP, GradientsEqualSingleProcessOnUnionAndParamsStayBitIdentical) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    DistributedDataParallel ddp(model, pg);
    // Construction broadcast: rank 1 now holds rank 0's initial weights.
    EXPECT_TRUE(torch::equal(flat_params(model->parameters()), flat_params(make_model(1)->parameters())));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 4; ++step) {
      opt.zero_grad();
      auto d = rank_batch(step, rank);
      torch::mse_loss(ddp->forward(d.x), d.y).backward();
      const auto grads = flat_grads(model->parameters());
      EXPECT_LE(rel_err(grads, reference_grads(step, step)), 1e-6) << "step " << step;
      EXPECT_TRUE(same_on_all_ranks(pg, grads)) << "step " << step;
      opt.step();
      EXPECT_TRUE(same_on_all_ranks(pg, flat_params(model->parameters()))) << "step " << step;
    }
  });
}

// A checkpoint loaded with Module::load() after DDP was built (the Python habit: wrap, then
// load_state_dict) must still reduce: LibTorch's load re-points parameters at new storage.
TEST(DDP, LoadingWeightsAfterConstructionStillReduces) {
  std::stringstream saved;
  {
    torch::serialize::OutputArchive out;
    make_model(1)->save(out);
    out.save_to(saved);
  }
  const std::string bytes = saved.str();
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 5);
    DistributedDataParallel ddp(model, pg);
    torch::serialize::InputArchive in;
    std::istringstream stream(bytes);
    in.load_from(stream);
    model->load(in);
    auto d = rank_batch(0, rank);
    torch::mse_loss(ddp->forward(d.x), d.y).backward();
    const auto grads = flat_grads(model->parameters());
    EXPECT_LE(rel_err(grads, reference_grads(0, 0)), 1e-6);
    EXPECT_TRUE(same_on_all_ranks(pg, grads));
  });
}

TEST(DDP, BuffersFollowRankZero) {
  for (bool broadcast : {true, false}) {
    on_ranks(2, [&](int rank, const ProcessGroup& pg) {
      torch::manual_seed(rank + 1);
      torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
      if (rank == 1) model->buffers()[0].fill_(42.0);  // running_mean differs before wrapping
      DistributedDataParallel ddp(model, pg, DistributedDataParallelOptions().broadcast_buffers(broadcast));
      auto buffers = [&] { return flat_params(model->buffers()); };
      EXPECT_TRUE(same_on_all_ranks(pg, buffers()));  // construction always syncs buffers
      auto x = torch::randn({6, 4}, at::detail::createCPUGenerator(7 + rank), torch::kFloat);
      ddp->forward(x).sum().backward();
      EXPECT_FALSE(same_on_all_ranks(pg, buffers()));  // different data -> different running stats
      // Same data on both ranks: with broadcast, rank 1 starts from rank 0's stats -> equal after.
      auto same = torch::randn({6, 4}, at::detail::createCPUGenerator(99), torch::kFloat);
      ddp->forward(same).sum().backward();
      EXPECT_EQ(same_on_all_ranks(pg, buffers()), broadcast);
    });
  }
}

TEST(DDP, Bf16ParametersReduceAndStayIdentical) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    model->to(torch::kBFloat16);
    DistributedDataParallel ddp(model, pg);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    // Reference in bf16 on the union batch.
    auto ref = make_model(1);
    ref->to(torch::kBFloat16);
    auto g = global_batch(0);
    torch::mse_loss(ref->forward(g.x.to(torch::kBFloat16)).to(torch::kFloat), g.y).backward();
    auto d = rank_batch(0, rank);
    torch::mse_loss(ddp->forward(d.x.to(torch::kBFloat16)).to(torch::kFloat), d.y).backward();
    const auto grads = flat_grads(model->parameters());
    EXPECT_EQ(model->parameters()[0].grad().scalar_type(), torch::kBFloat16);
    EXPECT_LE(rel_err(grads, flat_grads(ref->parameters())), 3e-2);
    EXPECT_TRUE(same_on_all_ranks(pg, grads));
    opt.step();
    EXPECT_TRUE(same_on_all_ranks(pg, flat_params(model->parameters())));
  });
}
