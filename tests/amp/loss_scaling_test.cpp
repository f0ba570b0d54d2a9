// apex's loss scaling on top of ampp::GradScaler: skip on overflow, dynamic/static scale, several
// losses with their own scales, delayed unscaling for gradient accumulation.
#include <ampp/amp/initialize.h>

#include "amp/reference_nets.h"
#include "ampp_test.h"

#include <torch/torch.h>

using ampp::OptLevel;
using ampp::Properties;
using ampp_test::RefCnn;

namespace {

const ampp_test::SyntheticImages& data() {
  static const auto d = ampp_test::SyntheticImages::make(64, 12, 10, /*seed=*/3);
  return d;
}

torch::Tensor cnn_loss(ampp::Amp& amp, RefCnn& net, double factor = 1.0, int64_t start = 0) {
  auto out = amp.forward(net, data().images.narrow(0, start, 16));
  return torch::nn::functional::cross_entropy(out, data().labels.narrow(0, start, 16)) * factor;
}

}  // namespace

TEST(LossScaling, OverflowSkipsTheStepAndHalvesTheScale) {
  RefCnn net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto amp = ampp::initialize(net, opt, Properties("O2").verbosity(0));
  EXPECT_EQ(amp.loss_scale(), 65536.0);  // apex LossScaler: 2^16

  const auto model_before = ampp_test::snapshot(net->parameters());
  const auto masters_before = ampp_test::snapshot(amp.master_params(opt));
  amp.scale_loss(cnn_loss(amp, net, /*factor=*/1e36)).backward();  // 1e36 * 2^16 overflows float32
  EXPECT_FALSE(amp.step());
  EXPECT_EQ(amp.skipped_steps(), 1);
  EXPECT_EQ(amp.loss_scale(), 32768.0);
  EXPECT_TRUE(ampp_test::same_bits(ampp_test::snapshot(net->parameters()), model_before));
  EXPECT_TRUE(ampp_test::same_bits(ampp_test::snapshot(amp.master_params(opt)), masters_before));
  EXPECT_TRUE(opt.state().empty());  // no momentum was created from inf gradients
  for (const auto& m : amp.master_params(opt)) EXPECT_FALSE(m.grad().defined());

  amp.zero_grad();
  amp.scale_loss(cnn_loss(amp, net)).backward();
  EXPECT_TRUE(amp.step());
  EXPECT_EQ(amp.skipped_steps(), 1);
  EXPECT_EQ(amp.loss_scale(), 32768.0);
  EXPECT_FALSE(ampp_test::same_bits(ampp_test::snapshot(net->parameters()), model_before));
}

TEST(LossScaling, StaticScaleStaysPut) {
  RefCnn net;
  torch::optim::SGD opt(net->parameters(), 0.05);
  auto amp = ampp::initialize(net, opt, Properties("O2").loss_scale(128.0).verbosity(0));
  EXPECT_EQ(amp.loss_scale(), 128.0);
  for (int i = 0; i < 3; ++i) {
    amp.zero_grad();
    auto scaled = amp.scale_loss(cnn_loss(amp, net));
    EXPECT_EQ(scaled.scale(), 128.0);
    scaled.backward();
    EXPECT_TRUE(amp.step());
  }
  // An overflow is still skipped (ampp never applies an inf update), but the static scale stays.
  const auto before = ampp_test::snapshot(net->parameters());
  amp.zero_grad();
  amp.scale_loss(cnn_loss(amp, net, 1e38)).backward();
  EXPECT_FALSE(amp.step());
  EXPECT_EQ(amp.loss_scale(), 128.0);
  EXPECT_TRUE(ampp_test::same_bits(ampp_test::snapshot(net->parameters()), before));
}

// apex: x2 after 2000 consecutive clean backwards, capped at max_loss_scale; floor at min_loss_scale.
TEST(LossScaling, DynamicGrowthCapAndFloor) {
  at::set_num_threads(1);
  auto lin = torch::nn::Linear(2, 1);
  torch::optim::SGD opt(lin->parameters(), 1e-6);
  auto run = [&](Properties props, int steps, double factor) {
    auto amp = ampp::initialize(lin.ptr(), opt, props.verbosity(0));
    const auto x = torch::ones({1, 2});
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      amp.scale_loss(lin(x).sum() * factor).backward();
      amp.step();
    }
    return amp.loss_scale();
  };
  EXPECT_EQ(run(Properties("O1"), 1999, 1.0), 65536.0);
  EXPECT_EQ(run(Properties("O1"), 2000, 1.0), 131072.0);
  EXPECT_EQ(run(Properties("O1").max_loss_scale(65536.0), 2000, 1.0), 65536.0);
  EXPECT_EQ(run(Properties("O1").max_loss_scale(1024.0), 0, 1.0), 1024.0);  // init = min(2^16, max)
  EXPECT_EQ(run(Properties("O1").min_loss_scale(16384.0), 5, 1e38), 16384.0);
  EXPECT_EQ(run(Properties("O1"), 5, 1e38), 2048.0);  // 2^16 / 2^5, no floor
}

// Two losses with their own scalers (num_losses = 2) and different scales: gradients still combine
// exactly as new / scale + stashed. O0 with a dynamic scale keeps everything FP32, so the result can
// be compared bit for bit with plain autograd.
TEST(LossScaling, SeveralLossesWithTheirOwnScales) {
  at::set_num_threads(1);
  torch::manual_seed(4);
  RefCnn net, ref;
  {
    torch::NoGradGuard no_grad;
    auto src = net->parameters(), dst = ref->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::optim::SGD opt(net->parameters(), 0.1);
  auto amp = ampp::initialize(net, opt, Properties("O0").loss_scale("dynamic").num_losses(2).verbosity(0));
  // Make loss 1's scale differ: one overflowing backward halves it.
  amp.scale_loss(cnn_loss(amp, net, 1e38), 1).backward();
  EXPECT_FALSE(amp.step());
  EXPECT_EQ(amp.loss_scale(0), 65536.0);
  EXPECT_EQ(amp.loss_scale(1), 32768.0);

  amp.zero_grad();
  amp.scale_loss(cnn_loss(amp, net, 1.0, 0), 0).backward();
  amp.scale_loss(cnn_loss(amp, net, 0.5, 16), 1).backward();
  auto ref_loss = torch::nn::functional::cross_entropy(ref->forward(data().images.narrow(0, 0, 16)),
                                                       data().labels.narrow(0, 0, 16)) +
                  torch::nn::functional::cross_entropy(ref->forward(data().images.narrow(0, 16, 16)),
                                                       data().labels.narrow(0, 16, 16)) *
                      0.5;
  ref_loss.backward();
  const auto got = net->parameters(), want = ref->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i].grad(), want[i].grad(), 1e-5, 1e-7)) << i;
  }
}

TEST(LossScaling, DelayUnscaleAccumulatesMicroBatches) {
  at::set_num_threads(1);
  torch::manual_seed(6);
  RefCnn net, ref;
  {
    torch::NoGradGuard no_grad;
    auto src = net->parameters(), dst = ref->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::optim::SGD opt(net->parameters(), 0.1);
  auto amp = ampp::initialize(net, opt, Properties("O0").loss_scale("dynamic").verbosity(0));
  amp.scale_loss(cnn_loss(amp, net, 1.0, 0), ampp::ScaleLossOptions().delay_unscale(true)).backward();
  AMPP_EXPECT_THROW_WITH(amp.step(), "still scaled");
  amp.scale_loss(cnn_loss(amp, net, 1.0, 16)).backward();
  for (int s = 0; s < 2; ++s) {
    torch::nn::functional::cross_entropy(ref->forward(data().images.narrow(0, 16 * s, 16)),
                                         data().labels.narrow(0, 16 * s, 16))
        .backward();
  }
  const auto got = net->parameters(), want = ref->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i].grad(), want[i].grad(), 1e-5, 1e-7)) << i;
  }
  EXPECT_EQ(amp.scaler().get_growth_tracker(), 1);  // one scale update for the two micro-batches
  EXPECT_TRUE(amp.step());
}

TEST(LossScaling, O0AndO3DefaultsDoNotScale) {
  for (const char* level : {"O0", "O3"}) {
    RefCnn net;
    torch::optim::SGD opt(net->parameters(), 0.1);
    auto amp = ampp::initialize(net, opt, Properties(level).verbosity(0));
    auto scaled = amp.scale_loss(cnn_loss(amp, net));
    EXPECT_EQ(scaled.scale(), 1.0) << level;
    EXPECT_EQ(scaled.tensor().scalar_type(), torch::kFloat) << level;
    scaled.backward();
    EXPECT_TRUE(amp.step()) << level;
  }
}

TEST(LossScaling, O1RunsTheForwardUnderAutocast) {
  RefCnn net;
  torch::optim::SGD opt(net->parameters(), 0.1);
  auto amp = ampp::initialize(net, opt, Properties("O1").verbosity(0));
  {
    auto region = amp.autocast();
    EXPECT_EQ(net->fc(torch::ones({2, 144})).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(net->fc(torch::ones({2, 144})).scalar_type(), torch::kFloat);
  EXPECT_EQ(amp.forward(net, data().images.narrow(0, 0, 4)).scalar_type(), torch::kFloat);  // output cast back
}

// Amp::zero_grad() defers the zeros (the backward's grads need no stash and no add), but a param the
// next backward does not reach must still be stepped with a zero grad, as after LibTorch's
// optimizer.zero_grad(): with weight decay w <- w - lr * wd * w (hand-computed below).
TEST(LossScaling, ZeroGradGivesUnreachedParamsZeroGradsLikeLibTorch) {
  torch::manual_seed(0);
  torch::nn::Linear used(4, 1), unused(4, 1);
  std::vector<torch::Tensor> params = used->parameters();
  for (const auto& p : unused->parameters()) params.push_back(p);
  const double lr = 0.5, wd = 0.1;
  torch::optim::SGD opt(params, torch::optim::SGDOptions(lr).weight_decay(wd));
  auto amp =
      ampp::initialize({used.ptr(), unused.ptr()}, {&opt}, Properties("O1").dtype(torch::kBFloat16).verbosity(0));
  const auto x = torch::ones({2, 4});
  // Step 1 reaches both (so both have grads, as LibTorch's zero_grad() only zeroes defined grads).
  amp.zero_grad();
  amp.scale_loss((used(x) + unused(x)).sum()).backward();
  ASSERT_TRUE(amp.step());
  const auto unused_before = ampp_test::snapshot(unused->parameters());
  // Step 2 reaches only `used`.
  amp.zero_grad();
  EXPECT_FALSE(unused->weight.grad().defined());  // deferred, not written
  amp.scale_loss(used(x).sum()).backward();
  ASSERT_TRUE(unused->weight.grad().defined());
  EXPECT_TRUE(torch::equal(unused->weight.grad(), torch::zeros_like(unused->weight)));
  // The reached param's grad is exactly the backward's (sum over 2 rows of ones: 2 per weight).
  EXPECT_TRUE(torch::equal(used->weight.grad(), torch::full_like(used->weight, 2.0)));
  ASSERT_TRUE(amp.step());
  const auto after = ampp_test::snapshot(unused->parameters());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(torch::allclose(after[i], unused_before[i] * (1 - lr * wd), 0, 1e-7)) << i;
    EXPECT_FALSE(torch::equal(after[i], unused_before[i])) << i;
  }
  // zero_grad() then step() without a backward: zeros again, weight decay only.
  amp.zero_grad();
  const auto before_bare = ampp_test::snapshot(used->parameters());
  ASSERT_TRUE(amp.step());
  EXPECT_TRUE(torch::allclose(used->weight, before_bare[0] * (1 - lr * wd), 0, 1e-7));
}

// Under O2 the FP32 master grads live in buffers reused from step to step; accumulating two
// backwards must still give exactly grad(loss 1) + grad(loss 2), i.e. the second backward must not
// convert into the buffer the first one's gradients are stashed in.
TEST(LossScaling, O2AccumulatesTwoBackwardsIntoTheMasters) {
  at::set_num_threads(1);
  torch::manual_seed(8);
  RefCnn net;
  torch::optim::SGD opt(net->parameters(), 0.1);
  auto amp = ampp::initialize(net, opt, Properties("O2").dtype(torch::kBFloat16).verbosity(0));
  auto master_grads = [&] {
    std::vector<torch::Tensor> out;
    for (const auto& m : amp.master_params(opt)) out.push_back(m.grad().clone());
    return out;
  };
  for (int round = 0; round < 2; ++round) {  // the second round runs on buffers left by the first
    amp.zero_grad();
    amp.scale_loss(cnn_loss(amp, net, 1.0, 0)).backward();
    const auto g1 = master_grads();
    amp.zero_grad();
    amp.scale_loss(cnn_loss(amp, net, 1.0, 16)).backward();
    const auto g2 = master_grads();
    amp.zero_grad();
    amp.scale_loss(cnn_loss(amp, net, 1.0, 0)).backward();
    amp.scale_loss(cnn_loss(amp, net, 1.0, 16)).backward();
    const auto both = master_grads();
    ASSERT_EQ(both.size(), g1.size());
    for (size_t i = 0; i < both.size(); ++i) {
      EXPECT_TRUE(torch::equal(both[i], g1[i] + g2[i])) << "round " << round << ", master " << i;
      EXPECT_FALSE(torch::equal(g1[i], g2[i])) << i;
    }
  }
}
