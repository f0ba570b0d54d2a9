// ampp::CudaGraphStep on a real GPU: a captured fp16 training step (autocast, GradScaler, FusedSGD)
// replayed 1,000 times with injected infs equals the same step run eagerly, bit for bit; and what a graph
// cannot replay is refused with the cause.
#include <ampp/precision/autocast.h>
#include <ampp/scaling/cuda_graph_step.h>
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/scaling/grad_scaler.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "gpu_test_util.h"

namespace {

using ::testing::HasSubstr;

constexpr int kGraphSteps = 1000;

// A small classifier, its optimizer and scaler, started from the same weights every time.
struct Trainee {
  Trainee() {
    torch::manual_seed(7);
    net = torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 10));
    net->to(torch::kCUDA);
    opt = std::make_unique<ampp::FusedSGD>(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  torch::Tensor step(const torch::Tensor& x, const torch::Tensor& y) {
    opt->zero_grad();
    torch::Tensor loss;
    {
      ampp::autocast guard(torch::kCUDA, torch::kHalf);
      loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
    return loss.detach();
  }
  torch::nn::Sequential net{nullptr};
  std::unique_ptr<ampp::FusedSGD> opt;
  ampp::GradScaler scaler{ampp::GradScalerOptions().init_scale(1024).growth_interval(20)};
};

// Batches on the GPU, an inf in every 97th (the scale backs off; growth_interval 20 lets it grow again).
std::vector<std::pair<torch::Tensor, torch::Tensor>> batches(int n) {
  torch::manual_seed(11);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
  for (int s = 0; s < n; ++s) {
    auto x = torch::randn({64, 32});
    if (s % 97 == 13) x[5][3] = std::numeric_limits<float>::infinity();
    out.emplace_back(x.to(torch::kCUDA), torch::randint(0, 10, {64}).to(torch::kCUDA));
  }
  return out;
}

}  // namespace

TEST(GpuCudaGraph, ReplayEqualsEagerBitForBitWithInjectedInfs) {
  AMPP_REQUIRE_GPU();
  const auto data = batches(kGraphSteps);
  Trainee eager, graphed;
  std::vector<double> eager_scales, graphed_scales;
  std::vector<float> eager_losses, graphed_losses;
  for (const auto& [x, y] : data) {
    eager_losses.push_back(eager.step(x, y).item<float>());
    eager_scales.push_back(eager.scaler.get_scale());
  }
  auto x = torch::empty({64, 32}, torch::kCUDA);
  auto y = torch::empty({64}, torch::TensorOptions(torch::kCUDA).dtype(torch::kLong));
  ampp::CudaGraphStep step({x, y}, [&] { return graphed.step(x, y); });
  for (const auto& [bx, by] : data) {
    graphed_losses.push_back(step({bx, by}).item<float>());  // outside the graph: a read is allowed here
    graphed_scales.push_back(graphed.scaler.get_scale());
  }
  EXPECT_TRUE(step.captured());
  EXPECT_EQ(step.steps(), kGraphSteps);
  EXPECT_EQ(graphed_scales, eager_scales);  // the whole trajectory, backoffs and growths
  EXPECT_GT(std::set<double>(eager_scales.begin(), eager_scales.end()).size(), 3u) << "the scale should move";
  for (size_t s = 0; s < eager_losses.size(); ++s) {
    if (std::isnan(eager_losses[s]))
      EXPECT_TRUE(std::isnan(graphed_losses[s])) << "step " << s;
    else
      EXPECT_EQ(graphed_losses[s], eager_losses[s]) << "step " << s;
  }
  const auto want = eager.net->parameters(), got = graphed.net->parameters();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << "parameter " << i;
  EXPECT_EQ(graphed.scaler.skipped_steps(), eager.scaler.skipped_steps());
  EXPECT_GE(eager.scaler.skipped_steps(), (kGraphSteps - 13 + 96) / 97);  // every injected inf, at least
}

TEST(GpuCudaGraph, RefusesASynchronisingStepAnotherShapeAndAnOuterAutocast) {
  AMPP_REQUIRE_GPU();
  Trainee t;
  auto x = torch::zeros({64, 32}, torch::kCUDA);
  auto y = torch::zeros({64}, torch::TensorOptions(torch::kCUDA).dtype(torch::kLong));
  ampp::CudaGraphStep reads_loss(
      {x, y},
      [&] {
        auto loss = t.step(x, y);
        if (loss.item<float>() > 1e9) loss.zero_();  // a host read: fine eagerly, impossible in a graph
        return loss;
      },
      ampp::CudaGraphStepOptions().warmup_steps(1));
  EXPECT_THAT([&] { reads_loss({x, y}); },
              ::testing::ThrowsMessage<c10::Error>(HasSubstr("synchronises with the host")));

  ampp::CudaGraphStep step({x, y}, [&] { return t.step(x, y); });
  EXPECT_THAT([&] { step({torch::zeros({63, 32}), y}); },
              ::testing::ThrowsMessage<c10::Error>(HasSubstr("replays fixed shapes")));
  ampp::autocast outer(torch::kCUDA, torch::kHalf);
  EXPECT_THAT([&] { step({x, y}); }, ::testing::ThrowsMessage<c10::Error>(HasSubstr("inside an autocast region")));
}
