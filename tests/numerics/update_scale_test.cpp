// amp_update_scale_ against hand-computed values of PyTorch's growth-tracker rule, and (LibTorch 2.2+)
// against ATen's own CPU kernel.

#include <ampp/numerics/update_scale.h>
#include <ampp/util/torch_version.h>

#include "ampp/numerics/torch_compat.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <random>

namespace {

using ampp::numerics::amp_update_scale_;

struct State {
  torch::Tensor scale = torch::full({}, 8.0f);
  torch::Tensor tracker = torch::zeros({}, torch::kInt);
  void step(bool inf, double growth = 2.0, double backoff = 0.5, int64_t interval = 3) {
    auto found = torch::full({}, inf ? 1.0f : 0.0f);
    amp_update_scale_(scale, tracker, found, growth, backoff, interval);
  }
  float s() const { return scale.item<float>(); }
  int t() const { return tracker.item<int>(); }
};

TEST(UpdateScale, FollowsTheGrowthTrackerRule) {
  State st;
  // F F F(grow) F N(backoff) F F F(grow) N N F
  const bool script[] = {false, false, false, false, true, false, false, false, true, true, false};
  const float scales[] = {8, 8, 16, 16, 8, 8, 8, 16, 8, 4, 4};
  const int trackers[] = {1, 2, 0, 1, 0, 1, 2, 0, 0, 0, 1};
  for (size_t i = 0; i < std::size(script); ++i) {
    st.step(script[i]);
    EXPECT_EQ(st.s(), scales[i]) << "step " << i;
    EXPECT_EQ(st.t(), trackers[i]) << "step " << i;
  }
}

TEST(UpdateScale, FoundInfIsTestedForNonZeroNotOne) {
  State st;
  auto found = torch::full({}, 3.0f);  // sums over optimizers can exceed 1
  amp_update_scale_(st.scale, st.tracker, found, 2.0, 0.5, 3);
  EXPECT_EQ(st.s(), 4.0f);
}

TEST(UpdateScale, ProductsInDoubleStoredAsFloatAndGrowthToInfFollowsTheLibTorchVersion) {
  State st;
  st.scale.fill_(3.0f);
  st.step(true, 2.0, 0.1);  // 3 * 0.1 in double, then rounded once to float
  EXPECT_EQ(st.s(), static_cast<float>(3.0 * 0.1));
  st.scale.fill_(std::numeric_limits<float>::max());
  st.step(false, 2.0, 0.5, 1);
  // 1.13 grows into +inf; 2.1+ keeps the finite scale (and still resets the tracker).
  EXPECT_EQ(st.s(), ampp::numerics::compat::kGrowthKeepsScaleFinite ? std::numeric_limits<float>::max()
                                                                    : std::numeric_limits<float>::infinity());
  EXPECT_EQ(st.t(), 0);
}

#if AMPP_TORCH_AT_LEAST(2, 2)
// ATen has a CPU kernel since 2.2: the same random script through both, bit for bit, including odd
// factors, scales near float's limits and found_inf values other than 1.
TEST(UpdateScale, MatchesAtenCpuKernel) {
  std::mt19937 rng(7);
  for (const double start : {8.0, 1e38, 1e-38, 3.0}) {
    State mine, aten;
    mine.scale.fill_(start), aten.scale.fill_(start);
    for (int i = 0; i < 200; ++i) {
      const float found_value = rng() % 4 == 0 ? static_cast<float>(1 + rng() % 3) : 0.0f;
      const double growth = (rng() % 2) ? 2.0 : 1.7, backoff = (rng() % 2) ? 0.5 : 0.3;
      const int64_t interval = 1 + rng() % 3;
      auto found = torch::full({}, found_value);
      amp_update_scale_(mine.scale, mine.tracker, found, growth, backoff, interval);
      at::_amp_update_scale_(aten.scale, aten.tracker, found, growth, backoff, interval);
      ASSERT_TRUE(torch::equal(mine.scale, aten.scale)) << "step " << i << ": " << mine.s() << " vs " << aten.s();
      ASSERT_EQ(mine.t(), aten.t()) << "step " << i;
    }
  }
}
#endif

TEST(UpdateScale, TrackerAboveIntervalNeverGrowsUntilReset) {
  State st;
  st.tracker.fill_(5);
  st.step(false, 2.0, 0.5, 3);
  EXPECT_EQ(st.t(), 6);
  EXPECT_EQ(st.s(), 8.0f);
}

TEST(UpdateScale, RejectsWrongDtypesAndShapes) {
  State st;
  auto found = torch::zeros({});
  auto bad_tracker = torch::zeros({}, torch::kLong);
  EXPECT_THAT([&] { amp_update_scale_(st.scale, bad_tracker, found, 2, 0.5, 3); },
              ::testing::ThrowsMessage<c10::Error>(::testing::HasSubstr("growth_tracker must be an int tensor.")));
  auto two = torch::zeros({2});
  EXPECT_THAT([&] { amp_update_scale_(two, st.tracker, found, 2, 0.5, 3); },
              ::testing::ThrowsMessage<c10::Error>(::testing::HasSubstr("current_scale must be a 1-element tensor.")));
  auto dscale = torch::zeros({}, torch::kDouble);
  EXPECT_THAT([&] { amp_update_scale_(dscale, st.tracker, found, 2, 0.5, 3); },
              ::testing::ThrowsMessage<c10::Error>(::testing::HasSubstr("current_scale must be a float tensor.")));
}

}  // namespace
