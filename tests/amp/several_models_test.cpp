// Several models, optimizers and losses under one ampp::initialize (apex's amp.initialize([G, D], [optG, optD],
// num_losses=3)): a GAN steps each optimizer when its own backward is done (amp.step(optimizer)), each loss
// has its scaler, an overflow skips only the optimizer its loss reached, and the whole loop trains exactly as
// the documented workaround, one initialize per model. Stepping every optimizer mid-GAN is a clear error.
#include <ampp/amp/initialize.h>

#include "ampp_test.h"

#include <torch/torch.h>

#include <limits>
#include <vector>

namespace several_models_test {

using ampp::Properties;

// A tiny GAN: G maps noise to "images" of 16 values, D scores them.
struct Gan {
  Gan() {
    torch::manual_seed(0);
    g = torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 16));
    d = torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::LeakyReLU(), torch::nn::Linear(32, 1));
    opt_g = std::make_unique<torch::optim::Adam>(g->parameters(), torch::optim::AdamOptions(1e-3).betas({0.5, 0.999}));
    opt_d = std::make_unique<torch::optim::Adam>(d->parameters(), torch::optim::AdamOptions(1e-3).betas({0.5, 0.999}));
  }
  torch::nn::Sequential g{nullptr}, d{nullptr};
  std::unique_ptr<torch::optim::Adam> opt_g, opt_d;
};

Properties o2(int64_t num_losses) {
  return Properties("O2").dtype(torch::kBFloat16).num_losses(num_losses).verbosity(0);
}

torch::Tensor bce(const torch::Tensor& logits, double target) {
  return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, target));
}

// One DCGAN iteration (the PyTorch example's order): D on real and on detached fakes, D's step; then G through
// D, G's step. `amp_d` and `amp_g` are one handle (with loss ids 0, 1, 2) or one per model (ids 0, 1 and 0).
// `inf_fake`: D's loss on the fakes overflows.
void iteration(Gan& gan, ampp::Amp& amp_d, ampp::Amp& amp_g, int64_t id_g, int step, bool inf_fake) {
  const auto real = torch::randn({32, 16}) + 2, noise = torch::randn({32, 8});
  amp_d.zero_grad();
  amp_g.zero_grad();
  const auto fake = amp_g.forward(gan.g, noise);
  amp_d.scale_loss(bce(amp_d.forward(gan.d, real), 1), *gan.opt_d, 0).backward();
  auto loss_fake = bce(amp_d.forward(gan.d, fake.detach()), 0);
  if (inf_fake) loss_fake = loss_fake * std::numeric_limits<float>::infinity();
  amp_d.scale_loss(loss_fake, *gan.opt_d, 1).backward();
  amp_d.step(*gan.opt_d);
  amp_g.scale_loss(bce(amp_d.forward(gan.d, fake), 1), *gan.opt_g, id_g).backward();  // reaches D too, scaled
  amp_g.step(*gan.opt_g);
  (void)step;
}

}  // namespace several_models_test

using namespace several_models_test;

TEST(SeveralModels, StepOfOneOptimizerStepsItsModelAloneAndStepOfAllIsAnErrorMidGan) {
  Gan gan;
  auto amp = ampp::initialize({gan.g.ptr(), gan.d.ptr()}, {gan.opt_g.get(), gan.opt_d.get()}, o2(3));
  const auto g_model = ampp_test::snapshot(gan.g->parameters());
  const auto g_masters = ampp_test::snapshot(amp.master_params(*gan.opt_g));
  const auto d_model = ampp_test::snapshot(gan.d->parameters());
  amp.zero_grad();
  const auto fake = amp.forward(gan.g, torch::randn({32, 8}));
  amp.scale_loss(bce(amp.forward(gan.d, fake.detach()), 0), *gan.opt_d, 1).backward();
  // amp.step() would step G too, with no gradient of its own, between G's forward and its backward.
  AMPP_EXPECT_THROW_WITH(amp.step(), "optimizer 1 (in initialize()'s order) got no gradients since its last step");
  EXPECT_TRUE(amp.step(*gan.opt_d));
  EXPECT_TRUE(ampp_test::same_bits(ampp_test::snapshot(gan.g->parameters()), g_model));
  EXPECT_TRUE(ampp_test::same_bits(ampp_test::snapshot(amp.master_params(*gan.opt_g)), g_masters));
  EXPECT_FALSE(ampp_test::same_bits(ampp_test::snapshot(gan.d->parameters()), d_model));
  // G's backward through the stepped D: G's forward saw weights nothing has changed since.
  amp.scale_loss(bce(amp.forward(gan.d, fake), 1), *gan.opt_g, 2).backward();
  EXPECT_TRUE(amp.step(*gan.opt_g));
  EXPECT_FALSE(ampp_test::same_bits(ampp_test::snapshot(gan.g->parameters()), g_model));
  torch::optim::SGD stranger(gan.g->parameters(), torch::optim::SGDOptions(0.1));
  AMPP_EXPECT_THROW_WITH(amp.step(stranger), "was not passed to ampp::initialize() for this handle");
}

// One initialize over both models trains the GAN exactly as one initialize per model (the workaround before
// step(optimizer)): the same weights, bit for bit, after an overflow in D's loss on the fakes that skips D's
// step alone and halves that loss's scale alone.
TEST(SeveralModels, OneInitializeTrainsAGanAsOnePerModelAndAnOverflowSkipsOnlyItsOptimizer) {
  Gan one, two;
  auto amp = ampp::initialize({one.g.ptr(), one.d.ptr()}, {one.opt_g.get(), one.opt_d.get()}, o2(3));
  auto amp_g = ampp::initialize(two.g, *two.opt_g, o2(1));
  auto amp_d = ampp::initialize(two.d, *two.opt_d, o2(2));
  for (int step = 0; step < 6; ++step) {
    torch::manual_seed(100 + step);
    iteration(one, amp, amp, 2, step, step == 3);
    torch::manual_seed(100 + step);
    iteration(two, amp_d, amp_g, 0, step, step == 3);
  }
  EXPECT_TRUE(ampp_test::same_bits(ampp_test::snapshot(one.g->parameters()), ampp_test::snapshot(two.g->parameters())));
  EXPECT_TRUE(ampp_test::same_bits(ampp_test::snapshot(one.d->parameters()), ampp_test::snapshot(two.d->parameters())));
  EXPECT_EQ(amp.skipped_steps(), 1);  // D's, at step 3
  EXPECT_EQ(amp_d.skipped_steps(), 1);
  EXPECT_EQ(amp_g.skipped_steps(), 0);
  EXPECT_EQ(amp.loss_scale(1), amp_d.loss_scale(1));
  EXPECT_EQ(amp.loss_scale(1), 32768.0);  // halved once
  EXPECT_EQ(amp.loss_scale(0), 65536.0);
  EXPECT_EQ(amp.loss_scale(2), amp_g.loss_scale(0));
  // The checkpoint holds each loss's scaler.
  const auto state = amp.state_dict();
  for (const char* key : {"loss_scaler0", "loss_scaler1", "loss_scaler2", "master_params"})
    EXPECT_TRUE(state.contains(key)) << key;
}
