// DDP buckets: overlap with backward, rebuild in gradient-ready order, gradients as bucket views.
#include "dist/ddp_test_util.h"

TEST(DDP, TinyBucketsOverlapBackwardWithUnchangedResults) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    // Limits [256 B, 1 KiB] over the parameters in reverse order (bytes): l3.bias 16 + l3.weight 512
    // -> 528 >= 256 closes {5, 4}; l2.bias 128 + l2.weight 4096 >= 1024 closes {3, 2}; l1.bias 128 +
    // l1.weight 1024 closes {1, 0}.
    DistributedDataParallel ddp(model, pg,
                                DistributedDataParallelOptions().bucket_cap_mb(1.0 / 1024).first_bucket_bytes(256));
    const auto& buckets = ddp.reducer().bucket_indices();
    ASSERT_EQ(buckets, (std::vector<std::vector<size_t>>{{5, 4}, {3, 2}, {1, 0}}));
    auto d = rank_batch(0, rank);
    torch::mse_loss(ddp->forward(d.x), d.y).backward();
    EXPECT_LE(rel_err(flat_grads(model->parameters()), reference_grads(0, 0)), 1e-6);
    const auto tl = ddp.reducer().last_timeline();
    ASSERT_EQ(tl.buckets.size(), buckets.size());
    // The first bucket's allreduce started while backward was still producing gradients.
    EXPECT_LT(tl.buckets.front().launched, tl.last_hook);
    for (const auto& b : tl.buckets) {
      EXPECT_LE(b.launched, tl.finalize_begin);
      EXPECT_LE(b.completed, tl.finalize_end);
    }
  });
}

namespace {
// The Mlp's layers registered in the reverse of the order forward uses them: registration order is
// then the order gradients become ready, the opposite of what the initial buckets assume.
struct ReversedMlpImpl : torch::nn::Module {
  torch::nn::Linear l3{nullptr}, l2{nullptr}, l1{nullptr};
  ReversedMlpImpl() {
    l3 = register_module("l3", torch::nn::Linear(32, 4));
    l2 = register_module("l2", torch::nn::Linear(32, 32));
    l1 = register_module("l1", torch::nn::Linear(8, 32));
  }
  torch::Tensor forward(torch::Tensor x) { return l3(torch::relu(l2(torch::relu(l1(x))))); }
};
TORCH_MODULE(ReversedMlp);

// Buckets as sets: the order of two parameters inside a bucket follows autograd's hook order.
std::vector<std::set<size_t>> as_sets(const std::vector<std::vector<size_t>>& buckets) {
  std::vector<std::set<size_t>> sets;
  for (const auto& b : buckets) sets.emplace_back(b.begin(), b.end());
  return sets;
}
}  // namespace

TEST(DDP, BucketsAreRebuiltInTheOrderGradientsBecameReady) {
  for (bool as_view : {false, true}) {
    on_ranks(2, [&](int rank, const ProcessGroup& pg) {
      torch::manual_seed(rank + 1);
      ReversedMlp model;
      // Parameters: 0 l3.weight (512 B), 1 l3.bias (16), 2 l2.weight (4096), 3 l2.bias (128),
      // 4 l1.weight (1024), 5 l1.bias (128). Limits [520 B, 4200 B]. Reverse registration order
      // 5, 4, ... gives {5, 4} (1152 B), {3, 2} (4224 B), {1, 0}: l1 first, whose gradients come last.
      DistributedDataParallel ddp(model, pg,
                                  DistributedDataParallelOptions()
                                      .bucket_cap_mb(4200.0 / (1024 * 1024))
                                      .first_bucket_bytes(520)
                                      .gradient_as_bucket_view(as_view));
      ASSERT_EQ(ddp.reducer().bucket_indices(), (std::vector<std::vector<size_t>>{{5, 4}, {3, 2}, {1, 0}}));
      // Reference: one process on the union batch, rank 0's initial weights.
      torch::manual_seed(1);
      ReversedMlp ref;
      torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        auto d = rank_batch(step, rank);
        torch::mse_loss(ddp->forward(d.x), d.y).backward();
        ref_opt.zero_grad();
        auto g = global_batch(step);
        torch::mse_loss(ref->forward(g.x), g.y).backward();
        EXPECT_LE(rel_err(flat_grads(model->parameters()), flat_grads(ref->parameters())), 1e-6)
            << "step " << step << " as_view " << as_view;
        const auto tl = ddp.reducer().last_timeline();
        if (step == 0) {
          // Bucket 0 holds l1, whose gradients are the last ones: it cannot start before backward ends.
          EXPECT_GE(tl.buckets.front().launched, tl.last_hook);
        } else {
          // Rebuilt before step 1's forward: l3 first, l2, then l1; bucket 0 starts during backward.
          EXPECT_EQ(as_sets(ddp.reducer().bucket_indices()), (std::vector<std::set<size_t>>{{0, 1}, {2, 3}, {4, 5}}));
          EXPECT_LT(tl.buckets.front().launched, tl.last_hook) << "step " << step;
        }
        if (as_view) {
          // Still bucket slots after the rebuild: l3's two grads share a bucket, l2's another one.
          const auto params = model->parameters();
          EXPECT_TRUE(params[0].grad().is_alias_of(params[1].grad())) << "step " << step;
          EXPECT_FALSE(params[1].grad().is_alias_of(params[2].grad())) << "step " << step;
        }
        opt.step();
        ref_opt.step();
      }
    });
  }
}

// Same operations in the same order, only without the copies: the results must match bit for bit.
TEST(DDP, GradientAsBucketViewIsBitIdenticalToCopying) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    const auto tiny = DistributedDataParallelOptions().bucket_cap_mb(1.0 / 1024).first_bucket_bytes(256);
    const auto as_view = DistributedDataParallelOptions(tiny).gradient_as_bucket_view(true);
    for (auto hook : {std::optional<BuiltinCommHook>(), std::optional(BuiltinCommHook::kFp16Compress)}) {
      const auto copying = train_steps(pg, rank, tiny, hook);
      const auto viewing = train_steps(pg, rank, as_view, hook);
      for (size_t s = 0; s < copying.grads.size(); ++s)
        EXPECT_TRUE(torch::equal(copying.grads[s], viewing.grads[s])) << "step " << s << ", hook " << hook.has_value();
      EXPECT_TRUE(torch::equal(copying.params, viewing.params)) << "hook " << hook.has_value();
    }
  });
}

TEST(DDP, GradientAsBucketViewGradsLiveInTheBucketsAndSurviveZeroGrad) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    // Buckets {5, 4}, {3, 2}, {1, 0} (see TinyBucketsOverlapBackwardWithUnchangedResults).
    DistributedDataParallel ddp(model, pg,
                                DistributedDataParallelOptions()
                                    .bucket_cap_mb(1.0 / 1024)
                                    .first_bucket_bytes(256)
                                    .gradient_as_bucket_view(true));
    const auto params = model->parameters();
    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
    auto backward = [&](int step) {
      auto d = rank_batch(step, rank);
      torch::mse_loss(ddp->forward(d.x), d.y).backward();
    };
    auto grad_pointers = [&] {
      std::vector<void*> ptrs;
      for (const auto& p : params) ptrs.push_back(p.grad().data_ptr());
      return ptrs;
    };
    backward(0);
    EXPECT_LE(rel_err(flat_grads(params), reference_grads(0, 0)), 1e-6);
    for (const auto& [a, b] : {std::pair{5, 4}, {3, 2}, {1, 0}})
      EXPECT_TRUE(params[a].grad().is_alias_of(params[b].grad())) << a << " and " << b << " share a bucket";
    EXPECT_FALSE(params[5].grad().is_alias_of(params[3].grad()));
    const auto slots = grad_pointers();
    opt.step();
    // LibTorch's zero_grad() detaches grads in place: it would throw on autograd views.
    ASSERT_NO_THROW(ampp::zero_grad_in_place(opt));
    EXPECT_EQ(flat_grads(params).abs().max().item<float>(), 0.0f);
    backward(1);
    EXPECT_LE(rel_err(flat_grads(params), reference_grads(1, 1)), 1e-6);
    EXPECT_EQ(grad_pointers(), slots) << "backward accumulated into the bucket slots";
    // Grads set to none: the next backward's fresh grads are copied in and become the slots again.
    opt.step();
    model->zero_grad(/*set_to_none=*/true);
    backward(2);
    EXPECT_LE(rel_err(flat_grads(params), reference_grads(2, 2)), 1e-6);
    EXPECT_EQ(grad_pointers(), slots);
  });
}
