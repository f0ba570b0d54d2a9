// What the memory report stands on: the tracker sees every tensor created after it is installed
// (bytes now and at the peak), and the optimizer-state visitor finds each known optimizer's tensors
// and refuses a state type it does not know.
#include <gtest/gtest.h>

#include <ampp/util/optimizer_compat.h>
#include <ampp/util/tensor_memory.h>
#include <torch/torch.h>

namespace {

TEST(TensorMemoryTracker, CountsEveryStorageNowAndAtItsPeak) {
  auto& tracker = ampp::TensorMemoryTracker::install();
  EXPECT_EQ(&tracker, &ampp::TensorMemoryTracker::install());  // once per process
  const int64_t before = tracker.current();
  tracker.reset_peak();
  {
    const auto a = torch::empty({1 << 20}, torch::kFloat);     // 4 MiB
    const auto b = torch::empty({3, 1000}, torch::kBFloat16);  // 6000 bytes
    EXPECT_EQ(tracker.current() - before, (4 << 20) + 6000);
    const auto view = a.narrow(0, 10, 100);  // a view allocates nothing
    EXPECT_EQ(tracker.current() - before, (4 << 20) + 6000);
  }
  EXPECT_EQ(tracker.current(), before);
  EXPECT_EQ(tracker.peak() - before, (4 << 20) + 6000);
  tracker.reset_peak();
  EXPECT_EQ(tracker.peak(), before);
}

std::vector<torch::Tensor> state_of(torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> all;
  for (auto& entry : opt.state())
    EXPECT_TRUE(ampp::for_each_state_tensor(*entry.second, [&](torch::Tensor& t) { all.push_back(t); }));
  return all;
}

void one_step(torch::optim::Optimizer& opt, const torch::Tensor& w) {
  opt.zero_grad();
  (w * w).sum().backward();
  opt.step();
}

TEST(OptimizerStateTensors, VisitsEachKnownOptimizersTensors) {
  auto w = torch::ones({5, 3}, torch::requires_grad());
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  one_step(sgd, w);
  auto sgd_state = state_of(sgd);
  ASSERT_EQ(sgd_state.size(), 1u);  // the momentum buffer
  EXPECT_EQ(sgd_state[0].sizes(), w.sizes());

  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.1).amsgrad(true));
  one_step(adam, w);
  auto adam_state = state_of(adam);
  ASSERT_EQ(adam_state.size(), 3u);  // exp_avg, exp_avg_sq, max_exp_avg_sq
  for (const auto& t : adam_state) EXPECT_EQ(t.sizes(), w.sizes());
}

TEST(OptimizerStateTensors, ReplacesTensorsInPlaceOfTheState) {
  auto w = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  one_step(sgd, w);
  auto& state = *sgd.state().begin()->second;
  ampp::for_each_state_tensor(state, [](torch::Tensor& t) { t = t.to(torch::kBFloat16); });
  EXPECT_EQ(static_cast<torch::optim::SGDParamState&>(state).momentum_buffer().scalar_type(), torch::kBFloat16);
}

struct UnknownState : torch::optim::OptimizerParamState {
  torch::Tensor moment;
};

TEST(OptimizerStateTensors, AnUnknownStateTypeIsRefusedNotSkippedSilently) {
  UnknownState state;
  int visited = 0;
  EXPECT_FALSE(ampp::for_each_state_tensor(state, [&](torch::Tensor&) { ++visited; }));
  EXPECT_EQ(visited, 0);
}

}  // namespace
