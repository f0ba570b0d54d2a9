// The delayed fp8 recipe (float8_delayed.h) on small cases computed by hand from TransformerEngine's formula,
// and its state in an ampp::Float8Linear: buffers, eval passes, clones and clear errors; and the fp8 doctor's
// recorder (float8_ranges.h). The recipe's products
// and every rounding are checked against a Python twin by the oracle suite (Float8DelayedOracle).
#include <ampp/precision/float8_linear.h>
#include <ampp/precision/float8_ranges.h>
#include <ampp/util/torch_version.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace float8_delayed_test {

#define AMPP_REQUIRE_FLOAT8_DELAYED() \
  if (!AMPP_TORCH_AT_LEAST(2, 6)) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer"

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

ampp::Float8LinearConfig delayed(int64_t len, ampp::Float8AmaxCompute algo, int64_t margin = 0) {
  return ampp::Float8LinearConfig()
      .recipe(ampp::Float8Recipe::kDelayed)
      .amax_history_len(len)
      .amax_compute_algo(algo)
      .margin(margin);
}

// One training pass whose x has amax `x_amax` (the weight: amax 1); returns the x scale it cast with.
float pass_with_x_amax(const ampp::Float8LinearConfig& config, const ampp::Float8DelayedState& state, float x_amax) {
  auto x = torch::full({16, 16}, x_amax);
  auto weight = torch::ones({16, 16}).requires_grad_();
  ampp::float8_delayed_linear(x, weight, torch::Tensor(), config, state, true).sum().backward();
  return state.scale[0].item<float>();
}

}  // namespace float8_delayed_test

using namespace float8_delayed_test;

TEST(Float8Delayed, TheScalesFollowTheHistoryAsTransformerEnginesFormulaSays) {
  AMPP_REQUIRE_FLOAT8_DELAYED();
  const auto max = delayed(3, ampp::Float8AmaxCompute::kMax);
  const auto state = ampp::make_float8_delayed_state(3, torch::kCPU);
  // Passes of amax 2, 4, 1, 0.5, 0.5, 0.5: each scale is 448 over the largest amax of the 3 passes before it.
  EXPECT_EQ(pass_with_x_amax(max, state, 2), 1.0F);  // no history yet: the initial scale
  EXPECT_EQ(pass_with_x_amax(max, state, 4), 224.0F);
  EXPECT_EQ(pass_with_x_amax(max, state, 1), 112.0F);
  EXPECT_EQ(pass_with_x_amax(max, state, 0.5), 112.0F);
  // Row 0: the last pass's amax, then the other two oldest first (the first pass's 2 has dropped out).
  EXPECT_TRUE(torch::equal(state.amax_history.select(1, 0), torch::tensor({0.5F, 4.0F, 1.0F})));
  EXPECT_EQ(pass_with_x_amax(max, state, 0.5), 112.0F);  // passes 2 to 4: 4
  EXPECT_EQ(pass_with_x_amax(max, state, 0.5), 448.0F);  // passes 3 to 5: 1

  const auto recent = delayed(3, ampp::Float8AmaxCompute::kMostRecent, /*margin=*/1);
  const auto other = ampp::make_float8_delayed_state(3, torch::kCPU);
  pass_with_x_amax(recent, other, 2);
  EXPECT_EQ(pass_with_x_amax(recent, other, 4), 112.0F);  // 448 / 2^1 / 2
  EXPECT_EQ(pass_with_x_amax(recent, other, 0), 56.0F);   // 448 / 2 / 4
  EXPECT_EQ(pass_with_x_amax(recent, other, 1), 56.0F);   // amax 0: the scale stays
  EXPECT_EQ(pass_with_x_amax(recent, other, 1e-37F), 224.0F);
  // A tiny amax: 224 / 1e-37 overflows float32, and the scale is float32's largest instead (TE's kernel).
  EXPECT_EQ(pass_with_x_amax(recent, other, 1), std::numeric_limits<float>::max());
}

TEST(Float8Delayed, ALayerKeepsItsStateInBuffersAndEvalPassesLeaveIt) {
  AMPP_REQUIRE_FLOAT8_DELAYED();
  ampp::Float8Linear layer(32, 64);
  layer->set_float8(delayed(8, ampp::Float8AmaxCompute::kMax));
  std::vector<std::string> names;
  for (const auto& b : layer->named_buffers()) names.push_back(b.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fp8_amax_history", "fp8_scale"}));
  EXPECT_EQ(layer->delayed_state().amax_history.sizes(), (std::vector<int64_t>{8, 3}));
  for (int i = 0; i < 3; ++i) layer(torch::randn({16, 32}) * (i + 1)).sum().backward();
  const auto history = layer->delayed_state().amax_history.clone();
  const auto next = ampp::float8_delayed_next_scales(layer->delayed_state(), *layer->float8());
  layer->eval();
  {
    torch::NoGradGuard no_grad;
    layer(torch::randn({16, 32}) * 100);
  }
  EXPECT_TRUE(torch::equal(layer->delayed_state().amax_history, history));
  layer->train();
  layer(torch::randn({16, 32})).sum().backward();
  EXPECT_TRUE(torch::equal(layer->delayed_state().scale, next));  // what the eval pass cast with
  // A clone carries the state, in buffers of its own.
  const auto copy = std::dynamic_pointer_cast<ampp::Float8LinearImpl>(layer->clone());
  EXPECT_TRUE(torch::equal(copy->delayed_state().amax_history, layer->delayed_state().amax_history));
  EXPECT_NE(copy->delayed_state().scale.data_ptr(), layer->delayed_state().scale.data_ptr());
}

TEST(Float8Delayed, MisuseIsAClearError) {
  AMPP_REQUIRE_FLOAT8_DELAYED();
  ampp::Float8Linear layer(16, 16);
  layer->set_float8(delayed(4, ampp::Float8AmaxCompute::kMax));
  auto message = error_of([&] { layer->set_float8(ampp::Float8LinearConfig()); });
  EXPECT_NE(message.find("holds the delayed recipe's state (4 passes of amax history)"), std::string::npos) << message;
  message = error_of([] { ampp::float8_linear(torch::randn({4, 16}), torch::randn({16, 16}), {}, delayed(4, {})); });
  EXPECT_NE(message.find("use ampp::float8_delayed_linear with a Float8DelayedState"), std::string::npos) << message;
  layer->to(torch::kBFloat16);
  message = error_of([&] { layer(torch::randn({4, 16}, torch::kBFloat16)); });
  EXPECT_NE(message.find("the amax history and scales must stay float32, got BFloat16"), std::string::npos) << message;
  message = error_of([] { ampp::make_float8_delayed_state(0, torch::kCPU); });
  EXPECT_NE(message.find("amax_history_len must be at least 1, got 0"), std::string::npos) << message;
}

namespace float8_delayed_test {

struct TwoFloat8Layers : torch::nn::Module {
  TwoFloat8Layers() {
    a = register_module("a", ampp::Float8Linear(16, 16));
    b = register_module("b", ampp::Float8Linear(16, 16));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(a(x)); }
  ampp::Float8Linear a{nullptr}, b{nullptr};
};

}  // namespace float8_delayed_test

// The fp8 doctor's recorder (float8_ranges.h): a step whose input outgrows the delayed scale saturates, and
// the first layer to go out of range is named with its step; values below the format's smallest flush.
TEST(Float8Ranges, TheRecorderNamesTheFirstTensorToSaturateAndCountsFlushes) {
  AMPP_REQUIRE_FLOAT8_DELAYED();
  TwoFloat8Layers net;
  ampp::convert_to_float8_training(net, delayed(1, ampp::Float8AmaxCompute::kMostRecent));
  ampp::Float8RangeRecorder recorder;
  recorder.set_step(1);
  net.forward(torch::ones({4, 16})).sum().backward();
  EXPECT_FALSE(recorder.first_saturated().has_value());
  recorder.set_step(2);
  net.forward(torch::ones({4, 16}) * 10).sum().backward();  // scaled for amax 1: 10 x 448 is out of range
  const auto first = recorder.first_saturated();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->layer, "a");
  EXPECT_EQ(first->tensor, "input");
  EXPECT_EQ(first->first_saturated_step, 2);
  EXPECT_EQ(first->saturated, 64);  // every value of the second pass
  EXPECT_GT(first->max_range_used, 9.9);
  const auto ranges = recorder.ranges();
  ASSERT_EQ(ranges.size(), 6U);  // a's and b's input, weight and gradient
  for (const auto& r : ranges) EXPECT_EQ(r.casts, 2) << r.layer << " " << r.tensor;
  EXPECT_EQ(ranges[2].tensor, "input");
  EXPECT_EQ(ranges[2].layer, "b");
  EXPECT_EQ(ranges.back().format, torch::kFloat8_e5m2);  // gradients: e5m2
}

TEST(Float8Ranges, TensorwiseNeverSaturatesAndFlushesWhatIsBelowE4m3sRange) {
  AMPP_REQUIRE_FLOAT8_DELAYED();
  ampp::Float8Linear layer(16, 16);
  ampp::convert_to_float8_training(*layer, ampp::Float8LinearConfig());
  ampp::Float8RangeRecorder recorder;
  auto x = torch::ones({4, 16});
  x.narrow(1, 0, 4).fill_(1e-8);  // 1e-8 x 448 is far below e4m3's smallest subnormal, 2^-9
  layer(x).sum().backward();
  {
    torch::NoGradGuard no_grad;  // an evaluation's forward: not measured
    layer(x);
  }
  const auto input = recorder.ranges().at(0);
  EXPECT_EQ(input.tensor, "input");
  EXPECT_EQ(input.casts, 1);
  EXPECT_EQ(input.saturated, 0);
  EXPECT_EQ(input.flushed, 16);
  EXPECT_NEAR(input.max_range_used, 1.0, 1e-6);
  EXPECT_FALSE(recorder.first_saturated().has_value());
}
