// DDP communication hooks: the built-in compression hooks and user hooks.
#include "dist/ddp_test_util.h"

// One value where the two bf16 forms differ: ranks hold 1 and 2^-8. PyTorch's hook sums the halves
// in bf16 (0.5 + 2^-9 is a tie between bf16 neighbours 2^-8 apart, rounded to even: 0.5); 1.13's
// Gloo cannot sum bf16, so ampp sums the bf16 payloads in fp32 there (0.5 + 2^-9 exactly).
TEST(DDP, Bf16CompressHookSumsInBf16WhereGlooCan) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    const auto param = torch::zeros({1});
    GradBucket bucket(0, 1, torch::full({1}, rank == 0 ? 1.0f : 0x1p-8f), {0}, {1}, {param});
    auto future = ampp::dist::bf16_compress_hook(pg)(bucket);
    future->wait();
    const float averaged = future->value().toTensor().item<float>();
    EXPECT_EQ(averaged, ampp::dist::compat::kGlooSumsBFloat16 ? 0.5f : 0.5f + 0x1p-9f);
  });
}

TEST(DDP, CompressionHooksWithinTheirPrecision) {
  for (auto type : {BuiltinCommHook::kFp16Compress, BuiltinCommHook::kBf16Compress}) {
    const double tol = type == BuiltinCommHook::kFp16Compress ? 2e-3 : 1.6e-2;  // ~2^-10, ~2^-7 (+ rounding)
    on_ranks(2, [&](int rank, const ProcessGroup& pg) {
      auto model = make_model(rank + 1);
      DistributedDataParallel ddp(model, pg,
                                  DistributedDataParallelOptions().bucket_cap_mb(1.0 / 1024).first_bucket_bytes(256));
      ddp.register_builtin_comm_hook(type);
      EXPECT_THROW(ddp.register_builtin_comm_hook(type), c10::Error);  // once only
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        auto d = rank_batch(step, rank);
        torch::mse_loss(ddp->forward(d.x), d.y).backward();
        const auto grads = flat_grads(model->parameters());
        if (step == 0) {
          const auto err = rel_err(grads, reference_grads(0, 0));
          EXPECT_LE(err, tol);
          EXPECT_GT(err, 0.0) << "compression should lose some precision";
        }
        EXPECT_TRUE(grads.scalar_type() == torch::kFloat);
        EXPECT_TRUE(same_on_all_ranks(pg, grads));
        opt.step();
        EXPECT_TRUE(same_on_all_ranks(pg, flat_params(model->parameters())));
      }
    });
  }
}

TEST(DDP, UserHookSeesEveryBucketOnce) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    DistributedDataParallel ddp(model, pg,
                                DistributedDataParallelOptions().bucket_cap_mb(1.0 / 1024).first_bucket_bytes(256));
    std::vector<size_t> seen;
    auto inner = allreduce_hook(pg);
    ddp.register_comm_hook([&](GradBucket& b) {
      seen.push_back(b.index());
      EXPECT_EQ(b.gradients().size(), b.parameters().size());
      EXPECT_EQ(b.is_last(), b.index() + 1 == ddp.reducer().bucket_indices().size());
      return inner(b);
    });
    auto d = rank_batch(0, rank);
    torch::mse_loss(ddp->forward(d.x), d.y).backward();
    std::vector<size_t> expected(ddp.reducer().bucket_indices().size());
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(seen, expected);
    EXPECT_LE(rel_err(flat_grads(model->parameters()), reference_grads(0, 0)), 1e-6);
  });
}
