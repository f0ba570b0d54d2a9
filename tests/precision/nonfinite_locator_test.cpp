// The numerics doctor's forward locator: the first op whose output became inf/NaN from finite inputs.

#include "ampp_test.h"
#include "precision/test_util.h"

#include <ampp/precision/autocast.h>
#include <ampp/precision/nonfinite_locator.h>

#include <ATen/ThreadLocalState.h>
#include <ATen/record_function.h>

#include <thread>

namespace {

using NonFiniteLocator = ampp_test::OneThread;
using ::testing::HasSubstr;

TEST_F(NonFiniteLocator, NamesTheOpWhereInfWasBornNotWhereItWasCarried) {
  std::optional<ampp::NonFiniteOrigin> origin;
  {
    ampp::NonFiniteLocator locate;
    const auto x = torch::tensor({1.0f, 100.0f});
    const auto y = torch::exp(x) * 2 + 1;  // e^100 overflows float32; mul and add only carry the inf
    EXPECT_TRUE(torch::isinf(y[1]).item<bool>());
    origin = locate.first();
    EXPECT_GE(locate.ops_seen(), 3);
  }
  ASSERT_TRUE(origin.has_value());
  ASSERT_FALSE(origin->ops.empty());
  EXPECT_EQ(origin->ops.back(), "aten::exp");
  ASSERT_EQ(origin->inputs.size(), 1u);
  EXPECT_THAT(origin->inputs[0], HasSubstr("in [1, 100]"));
  EXPECT_THAT(origin->output, HasSubstr("1 inf, 0 NaN of 2"));
  EXPECT_THAT(origin->describe(), HasSubstr("aten::exp"));
  EXPECT_FALSE(at::hasThreadLocalCallbacks()) << "the locator must leave nothing registered";
}

// Under fp16 emulation the GEMM is finite in float32; the rounding of its output to fp16 overflows
// (80000 > 65504): the origin is inside the user's linear call.
TEST_F(NonFiniteLocator, FindsTheFp16OverflowInsideALoweredOp) {
  std::optional<ampp::NonFiniteOrigin> origin;
  {
    ampp::NonFiniteLocator locate;
    ampp::autocast region(torch::kCPU, torch::kHalf);
    const auto y = torch::linear(torch::full({1, 4}, 200.0), torch::full({3, 4}, 100.0));
    EXPECT_TRUE(torch::isinf(y).all().item<bool>());
    origin = locate.first();
  }
  ASSERT_TRUE(origin.has_value());
  std::printf("%s\n", origin->describe().c_str());  // the line docs/numerics.md shows
  EXPECT_EQ(origin->ops.front(), "aten::linear") << origin->describe();
  EXPECT_THAT(origin->output, HasSubstr("3 inf, 0 NaN of 3"));
  // The rounding of the float32 result into fp16 is where the inf is born; its source was finite.
  EXPECT_EQ(origin->ops.back(), "aten::copy_") << origin->describe();
  ASSERT_EQ(origin->inputs.size(), 1u) << origin->describe();
  EXPECT_THAT(origin->inputs[0], HasSubstr("in [80000, 80000]"));
}

// A model of two layers: fc2's fp16 output overflows (inside fc2), or an exp after fc1 does (after it).
struct TwoLayers {
  TwoLayers() : net(torch::nn::Sequential({{"fc1", torch::nn::Linear(2, 2)}, {"fc2", torch::nn::Linear(2, 2)}})) {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.zero_();
    net->named_parameters()["fc1.weight"].fill_diagonal_(1.0);
    net->named_parameters()["fc2.weight"].fill_diagonal_(1000.0);
  }
  torch::nn::Sequential net;
};

TEST_F(NonFiniteLocator, NamesTheModuleByItsParameters) {
  TwoLayers m;
  std::optional<ampp::NonFiniteOrigin> inside, after;
  {
    ampp::NonFiniteLocator locate(*m.net);
    ampp::autocast region(torch::kCPU, torch::kHalf);
    m.net->forward(torch::full({1, 2}, 100.0));  // fc1: 100, fc2: 100000 > 65504
    inside = locate.first();
  }
  {
    ampp::NonFiniteLocator locate(*m.net);
    torch::exp(m.net[0]->as<torch::nn::Linear>()->forward(torch::full({1, 2}, 100.0)));  // e^100: inf
    after = locate.first();
  }
  ASSERT_TRUE(inside.has_value());
  EXPECT_EQ(inside->module, "fc2") << inside->describe();
  EXPECT_THAT(inside->describe(), HasSubstr("in module fc2"));
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->ops.back(), "aten::exp");
  EXPECT_EQ(after->module, "after fc1") << after->describe();
}

TEST_F(NonFiniteLocator, FindsNothingInAFiniteForwardAndIsOnePerProcess) {
  ampp::NonFiniteLocator locate;
  const auto y = torch::softmax(torch::randn({4, 5}), 1).sum();
  EXPECT_TRUE(std::isfinite(y.item<float>()));
  EXPECT_FALSE(locate.first().has_value());
  EXPECT_THROW(ampp::NonFiniteLocator second, c10::Error);
  std::string other_thread;
  std::thread([&] { other_thread = ampp_test::error_of([] { ampp::NonFiniteLocator second; }); }).join();
  EXPECT_THAT(other_thread, HasSubstr("another locator is active in this process"));
}

// The ops of a thread that runs this thread's work with its state, as autograd's worker thread runs a GPU's
// backward (issue 52, defect 9: the locator's state was thread_local, so a CUDA backward went unseen and an
// overflow born there was reported as "replayed finite").
TEST_F(NonFiniteLocator, SeesTheOpsOfAThreadThatRunsWithThisThreadsState) {
  ampp::NonFiniteLocator locate;
  const at::ThreadLocalState state;  // what the autograd engine hands its device threads
  std::thread worker([&] {
    at::ThreadLocalStateGuard guard(state);
    const auto y = torch::full({4}, 70000.0f).to(torch::kHalf);  // inf born in the narrowing cast
    EXPECT_TRUE(std::isinf(y[0].item<float>()));
  });
  worker.join();
  ASSERT_TRUE(locate.first().has_value()) << "the worker thread's ops were not seen";
  EXPECT_THAT(locate.first()->describe(), HasSubstr("aten::"));
  EXPECT_THAT(locate.first()->output, HasSubstr("4 inf"));
}

}  // namespace
