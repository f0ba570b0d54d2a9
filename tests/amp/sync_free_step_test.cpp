// Amp's step with a fused optimizer (ampp::FusedSGD): the overflow check, the scale update with apex's cap
// and the skip all stay on the device, so an O1 or O2 iteration reads nothing on the host (a GPU step
// stays asynchronous and a CUDA graph can capture it). The oracle is the same loop with
// torch::optim::SGD, whose skip Amp decides on the host. Without loss scaling, Amp::step_unless takes the
// caller's own flag the same way.
#include <ampp/amp/initialize.h>
#include <ampp/numerics/unscale.h>
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/util/torch_version.h>

#include "amp/reference_nets.h"
#include "ampp_test.h"
#include "host_reads.h"

#include <torch/torch.h>

#include <limits>
#include <set>

namespace sync_free_test {

using ampp::Properties;
using ampp_test::RefCnn;
using ampp_test::SyntheticImages;

constexpr int64_t kSide = 12, kBatch = 32, kSteps = 10;
const std::set<int64_t> kInfSteps{2, 6, 7};

struct Result {
  std::vector<torch::Tensor> params;
  int64_t skipped = 0;
  double scale = 0;
  int host_reads = 0;
};

Result train(const Properties& props, bool fused) {
  static const SyntheticImages d = SyntheticImages::make(256, kSide, 10, /*seed=*/3, /*noise=*/1.0);
  torch::manual_seed(5);
  RefCnn net(kSide);
  const auto sgd = torch::optim::SGDOptions(0.05).momentum(0.9);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (fused)
    opt = std::make_unique<ampp::FusedSGD>(net->parameters(), sgd);
  else
    opt = std::make_unique<torch::optim::SGD>(net->parameters(), sgd);
  auto amp = ampp::initialize(net, *opt, Properties(props).verbosity(0));
  Result r;
  {
    ampp_test::HostReadCounter counter;
    for (int64_t step = 0; step < kSteps; ++step) {
      auto x = d.images.narrow(0, step * kBatch % 224, kBatch), y = d.labels.narrow(0, step * kBatch % 224, kBatch);
      amp.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(amp.forward(net, x), y);
      if (kInfSteps.count(step)) loss = loss * std::numeric_limits<float>::infinity();
      amp.scale_loss(loss).backward();
      amp.step();
    }
    r.host_reads = counter.count();
  }
  for (const auto& p : net->parameters()) r.params.push_back(p.detach().clone());
  r.skipped = amp.skipped_steps();
  r.scale = amp.loss_scale();
  return r;
}

}  // namespace sync_free_test

TEST(AmpSyncFree, AFusedOptimizersStepReadsNothingAndSkipsAsTheHostPathDoes) {
  using namespace sync_free_test;
  if (!AMPP_TORCH_AT_LEAST(2, 4)) GTEST_SKIP() << "ATen's fused optimizer kernels need LibTorch 2.4 or newer";
  at::set_num_threads(1);
  for (const auto& props : {Properties("O1").dtype(torch::kHalf), Properties("O2").dtype(torch::kHalf),
                            Properties("O2").dtype(torch::kBFloat16).loss_scale(128.0)}) {
    SCOPED_TRACE(props.to_string());
    const Result host = train(props, /*fused=*/false), device = train(props, /*fused=*/true);
    EXPECT_EQ(device.host_reads, 0);
    EXPECT_GT(host.host_reads, 0) << "the counter sees the reads the fused path avoids";
    EXPECT_EQ(device.skipped, static_cast<int64_t>(kInfSteps.size()));
    EXPECT_EQ(host.skipped, device.skipped);
    EXPECT_EQ(host.scale, device.scale);
    ASSERT_EQ(host.params.size(), device.params.size());
    for (size_t i = 0; i < host.params.size(); ++i) {
      EXPECT_TRUE(torch::isfinite(device.params[i]).all().item<bool>()) << "parameter " << i;
      EXPECT_TRUE(torch::allclose(host.params[i].to(torch::kFloat), device.params[i].to(torch::kFloat), 1e-3, 1e-4))
          << "parameter " << i;
    }
  }
}

// A skipped step's inf/NaN gradients stay in place with a fused optimizer (apex drops them at once); a
// backward that accumulates onto them without zero_grad() must not carry them into the next step.
TEST(AmpSyncFree, AccumulatingOntoASkippedStepsGradientsDropsThemFirst) {
  using ampp::Properties;
  if (!AMPP_TORCH_AT_LEAST(2, 4)) GTEST_SKIP() << "ATen's fused optimizer kernels need LibTorch 2.4 or newer";
  auto lin = torch::nn::Linear(4, 2);
  ampp::FusedSGD opt(lin->parameters(), torch::optim::SGDOptions(0.1));
  auto amp =
      ampp::initialize(lin.ptr(), opt, Properties("O1").dtype(torch::kBFloat16).loss_scale("dynamic").verbosity(0));
  const auto x = torch::ones({3, 4});
  amp.scale_loss(lin->forward(x).sum() * std::numeric_limits<float>::infinity()).backward();
  amp.step();  // skipped on the device
  const auto before = lin->weight.detach().clone();
  amp.scale_loss(lin->forward(x).sum()).backward();  // no zero_grad(): accumulates
  amp.step();
  EXPECT_TRUE(torch::isfinite(lin->weight).all().item<bool>());
  EXPECT_FALSE(torch::equal(before, lin->weight.detach())) << "the finite step was taken";
  EXPECT_EQ(amp.skipped_steps(), 1);
}

// A loop without loss scaling (O0) checks its own gradients and steps with Amp::step_unless: the optimizers
// skip where the flag is set, a fused one on the device with no host read, a plain one on the host, and the
// ledger counts the skips either way.
TEST(AmpSyncFree, StepUnlessSkipsAnUnscaledLoopWhereItsFlagSaysAndTheLedgerCounts) {
  using ampp::Properties;
  if (!AMPP_TORCH_AT_LEAST(2, 4)) GTEST_SKIP() << "ATen's fused optimizer kernels need LibTorch 2.4 or newer";
  std::vector<torch::Tensor> weights;
  for (const bool fused : {false, true}) {
    torch::manual_seed(3);
    auto lin = torch::nn::Linear(4, 2);
    const auto sgd = torch::optim::SGDOptions(0.1);
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (fused)
      opt = std::make_unique<ampp::FusedSGD>(lin->parameters(), sgd);
    else
      opt = std::make_unique<torch::optim::SGD>(lin->parameters(), sgd);
    auto amp = ampp::initialize(lin.ptr(), *opt, Properties("O0").verbosity(0));
    ASSERT_FALSE(amp.checks_overflow());
    int reads = 0;
    for (int step = 0; step < 6; ++step) {
      amp.zero_grad();
      auto loss = lin->forward(torch::ones({3, 4}) * (step + 1)).pow(2).sum();
      if (step == 1 || step == 4) loss = loss * std::numeric_limits<float>::infinity();
      loss.backward();
      auto found = torch::zeros({});
      ampp::numerics::non_finite_check_and_unscale_({lin->weight.grad(), lin->bias.grad()}, found, torch::ones({}));
      ampp_test::HostReadCounter counter;
      amp.step_unless(found);
      reads += counter.count();
    }
    EXPECT_EQ(amp.ledger().steps(), 6) << fused;
    EXPECT_EQ(amp.skipped_steps(), 2) << fused;
    EXPECT_EQ(amp.ledger().taken(), 4) << fused;
    if (fused) EXPECT_EQ(reads, 0);
    EXPECT_TRUE(torch::isfinite(lin->weight).all().item<bool>()) << fused;
    weights.push_back(lin->weight.detach().clone());
  }
  EXPECT_TRUE(torch::allclose(weights[0], weights[1], 1e-5, 1e-6)) << "the plain and the fused steps agree";
}
