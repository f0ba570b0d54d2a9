// Error conditions (PyTorch's conditions and messages, plus ampp's option checks) and state_dict /
// archive round trips that resume the identical trajectory.

#include "ampp_test.h"
#include "scaler_test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <ampp/precision/autocast.h>

#include <optional>
#include <random>
#include <sstream>

namespace {

using ampp::GradScaler;
using ampp::GradScalerOptions;
using ampp::OptState;
using ampp_test::error_of;
using ampp_test::Tiny;
using ampp_test::trajectory;
using ::testing::HasSubstr;

// A backward inside an autocast region (PyTorch's docs advise against it) warns once a run, naming the fix;
// one after the region says nothing.
TEST(Errors, ABackwardInsideAnAutocastRegionWarns) {
  auto backward = [](bool inside) {
    GradScaler scaler;
    auto w = torch::randn({4, 4}, torch::requires_grad());
    ::testing::internal::CaptureStderr();
    {
      std::optional<ampp::autocast> region;
      region.emplace(torch::kCPU, torch::kBFloat16);
      auto loss = torch::randn({2, 4}).mm(w).sum();
      if (!inside) region.reset();
      scaler.scale(loss).backward();
    }
    return ::testing::internal::GetCapturedStderr();
  };
  EXPECT_EQ(backward(false).find("autocast"), std::string::npos);
  const auto inside = backward(true);
  EXPECT_NE(inside.find("a backward runs inside an autocast region"), std::string::npos) << inside;
  EXPECT_NE(inside.find("before backward() and the step"), std::string::npos) << inside;
}

// A GAN's iteration that steps the generator through the scaler after a backward of its unscaled loss: no
// loss was scaled since the last update(), an error naming the fix (PyTorch checks only that scale() ever ran).
TEST(Errors, AStepWithNoLossScaledSinceTheLastUpdateIsAnError) {
  GradScaler scaler;
  auto w = torch::randn({4, 4}, torch::requires_grad());
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));
  scaler.scale(torch::randn({2, 4}).mm(w).sum()).backward();
  scaler.step(opt);
  scaler.update();
  opt.zero_grad();
  torch::randn({2, 4}).mm(w).sum().backward();  // not scaled
  AMPP_EXPECT_THROW_WITH(scaler.step(opt), "no loss was scaled since the last update()");
  scaler.scale(torch::randn({2, 4}).mm(w).sum()).backward();
  EXPECT_NO_THROW(scaler.step(opt));
}

TEST(Errors, UnscaleTwiceAndUnscaleAfterStep) {
  GradScaler scaler;
  Tiny t;
  scaler.scale(t.p.sum()).backward();
  scaler.unscale_(t.opt);
  EXPECT_EQ(scaler.stage(t.opt), OptState::kUnscaled);
  AMPP_EXPECT_THROW_WITH(scaler.unscale_(t.opt),
                         "unscale_() has already been called on this optimizer since the last update().");
  // The failed call changed nothing: the grads were unscaled exactly once.
  EXPECT_TRUE(torch::equal(t.p.grad(), torch::ones({4})));
  EXPECT_TRUE(scaler.step(t.opt));
  EXPECT_EQ(scaler.stage(t.opt), OptState::kStepped);
  AMPP_EXPECT_THROW_WITH(scaler.unscale_(t.opt), "unscale_() is being called after step().");
  scaler.update();
  EXPECT_EQ(scaler.stage(t.opt), OptState::kReady);
}

TEST(Errors, StepTwiceNamesTheFix) {
  GradScaler scaler;
  Tiny t;
  scaler.scale(t.p.sum()).backward();
  scaler.step(t.opt);
  const auto msg = error_of([&] { scaler.step(t.opt); });
  EXPECT_THAT(msg, HasSubstr("step() has already been called since the last update()."));
  EXPECT_THAT(msg, HasSubstr("Call update()"));
}

TEST(Errors, UpdateWithoutStepOrUnscale) {
  GradScaler scaler;
  Tiny t;
  (void)scaler.scale(t.p.sum());
  AMPP_EXPECT_THROW_WITH(scaler.update(), "No inf checks were recorded prior to update.");
}

TEST(Errors, MethodsBeforeTheFirstScaleCall) {
  GradScaler scaler;
  Tiny t;
  t.p.mutable_grad() = torch::ones({4});
  const std::string tail =
      "but _scale is None.  This may indicate your script did not use "
      "scaler.scale(loss or outputs) earlier in the iteration.";
  AMPP_EXPECT_THROW_WITH(scaler.step(t.opt), "Attempted step " + tail);
  AMPP_EXPECT_THROW_WITH(scaler.unscale_(t.opt), "Attempted unscale_ " + tail);
  AMPP_EXPECT_THROW_WITH(scaler.update(), "Attempted update " + tail);
}

TEST(Errors, StepWithoutAnyGradient) {
  GradScaler scaler;
  Tiny t;
  (void)scaler.scale(t.p.sum());
  AMPP_EXPECT_THROW_WITH(scaler.step(t.opt), "No inf checks were recorded for this optimizer.");
}

TEST(Errors, ClosureRejectedWhenEnabled) {
  GradScaler scaler;
  Tiny t;
  scaler.scale(t.p.sum()).backward();
  AMPP_EXPECT_THROW_WITH(scaler.step(t.opt, [] { return torch::zeros({}); }),
                         "Closure use is not currently supported if GradScaler is enabled.");
}

TEST(Errors, Fp16GradientsRejectedUnlessAllowed) {
  auto p = torch::ones({3}, torch::kHalf).requires_grad_();
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  GradScaler strict;
  (void)strict.scale(torch::ones({}));
  p.mutable_grad() = torch::full({3}, 4.0, torch::kHalf);
  AMPP_EXPECT_THROW_WITH(strict.unscale_(opt), "Attempting to unscale FP16 gradients.");
  GradScaler lenient(GradScalerOptions().init_scale(4).allow_fp16_grads(true));
  (void)lenient.scale(torch::ones({}));
  lenient.unscale_(opt);
  EXPECT_TRUE(torch::equal(p.grad(), torch::ones({3}, torch::kHalf)));
}

TEST(Errors, BadOptionsAreRejectedWithTheFix) {
  struct Case {
    GradScalerOptions options;
    std::string message;
  };
  const std::vector<Case> cases = {
      {GradScalerOptions().growth_factor(1.0), "The growth factor must be > 1.0."},
      {GradScalerOptions().backoff_factor(1.0), "The backoff factor must be < 1.0."},
      {GradScalerOptions().backoff_factor(0.0), "The backoff factor must be > 0.0."},
      {GradScalerOptions().init_scale(0.0), "The initial scale must be finite and >= 2^-126"},
      {GradScalerOptions().init_scale(std::nan("")), "The initial scale must be finite and >= 2^-126"},
      {GradScalerOptions().growth_interval(0), "The growth interval must be >= 1."},
      {GradScalerOptions().hysteresis(0), "hysteresis must be >= 1"},
      {GradScalerOptions().min_scale(-1), "min_scale must be finite and >= 0"},
      {GradScalerOptions().max_scale(1024), "init_scale (65536) must lie in [min_scale, max_scale]"},
      {GradScalerOptions().init_scale(2).min_scale(4), "init_scale (2) must lie in [min_scale, max_scale]"},
      {GradScalerOptions().min_scale_patience(0), "min_scale_patience must be >= 1"},
  };
  for (const auto& c : cases) {
    AMPP_EXPECT_THROW_WITH(GradScaler s(c.options), c.message);
  }
  AMPP_EXPECT_THROW_WITH(GradScaler s(GradScalerOptions().growth_factor(0.9)),
                         "pass GradScalerOptions().growth_factor(x) with x > 1");
  // Setters do not re-validate (insightface sets the growth factor to 1 at the cap).
  GradScaler s;
  s.set_growth_factor(1.0);
  EXPECT_EQ(s.get_growth_factor(), 1.0);
}

TEST(Errors, UpdateWithNonPositiveNewScale) {
  GradScaler scaler;
  Tiny t;
  t.iterate(scaler, false);
  AMPP_EXPECT_THROW_WITH(scaler.update(0.0), "new_scale must be finite and >= 2^-126");
}

TEST(Errors, LoadingAnEmptyOrIncompleteStateDict) {
  GradScaler scaler;
  AMPP_EXPECT_THROW_WITH(scaler.load_state_dict(ampp::make_state_dict()),
                         "The source state dict is empty, possibly because it was saved from a disabled "
                         "instance of GradScaler.");
  const auto partial = ampp::make_state_dict({{"scale", 2.0}});
  AMPP_EXPECT_THROW_WITH(scaler.load_state_dict(partial), "key \"growth_factor\" is missing");
}

std::string random_script(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (rng() % 4 == 0) ? 'N' : 'F';
  return s;
}

TEST(StateDict, HasPyTorchsKeysAndTypes) {
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(3));
  trajectory(scaler, "FFFFNF");
  const auto sd = scaler.state_dict();
  ASSERT_TRUE(sd.contains("scale"));
  EXPECT_TRUE(sd.at("scale").isDouble());
  EXPECT_EQ(sd.at("scale").toDouble(), scaler.get_scale());
  EXPECT_EQ(sd.at("growth_factor").toDouble(), 2.0);
  EXPECT_EQ(sd.at("backoff_factor").toDouble(), 0.5);
  EXPECT_TRUE(sd.at("growth_interval").isInt());
  EXPECT_EQ(sd.at("growth_interval").toInt(), 3);
  EXPECT_TRUE(sd.at("_growth_tracker").isInt());
  EXPECT_EQ(sd.at("_growth_tracker").toInt(), scaler.get_growth_tracker());
  EXPECT_EQ(sd.at("_ampp_skipped_steps").toInt(), 1);
  EXPECT_EQ(sd.size(), 8u);
}

TEST(StateDict, RoundTripResumesTheIdenticalTrajectory) {
  const auto script = random_script(60, 42);
  GradScaler full(GradScalerOptions().init_scale(1024).growth_interval(3));
  const auto want = trajectory(full, script);

  GradScaler first(GradScalerOptions().init_scale(1024).growth_interval(3));
  trajectory(first, script.substr(0, 25));
  const auto sd = first.state_dict();

  GradScaler resumed;  // PyTorch defaults: everything that matters comes from the state dict
  resumed.load_state_dict(sd);
  EXPECT_EQ(resumed.get_scale(), want[24].scale);  // before lazy init
  EXPECT_EQ(resumed.get_growth_tracker(), want[24].tracker);
  EXPECT_EQ(resumed.get_growth_interval(), 3);
  const auto rest = trajectory(resumed, script.substr(25));
  EXPECT_EQ(rest, std::vector<ampp_test::Point>(want.begin() + 25, want.end()));
  EXPECT_EQ(resumed.skipped_steps(), full.skipped_steps());
}

TEST(StateDict, LoadIntoALiveScalerOverwritesTheTensors) {
  GradScaler a(GradScalerOptions().init_scale(8).growth_interval(3));
  trajectory(a, "FFFF");  // scale 16, tracker 1
  GradScaler b;
  trajectory(b, "F");
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.get_scale(), 16.0);
  EXPECT_EQ(b.get_growth_tracker(), 1);
  EXPECT_EQ(trajectory(b, "FF").back(), (ampp_test::Point{32, 0}));
}

TEST(StateDict, PyTorchOnlyKeysLoad) {
  const auto sd = ampp::make_state_dict({{"scale", 512.0},
                                         {"growth_factor", 4.0},
                                         {"backoff_factor", 0.25},
                                         {"growth_interval", int64_t{2}},
                                         {"_growth_tracker", int64_t{1}}});
  GradScaler scaler;
  scaler.load_state_dict(sd);
  EXPECT_EQ(trajectory(scaler, "FN"), (std::vector<ampp_test::Point>{{2048, 0}, {512, 0}}));
}

TEST(StateDict, ArchiveRoundTripKeepsPolicyState) {
  const auto opts = GradScalerOptions().init_scale(64).growth_interval(3).hysteresis(3);
  GradScaler a(opts);
  trajectory(a, "FNN");  // hysteresis budget 3 -> 1, scale unchanged
  EXPECT_EQ(a.hysteresis_tracker(), 1);
  std::stringstream buffer;
  {
    torch::serialize::OutputArchive out;
    a.save(out);
    out.save_to(buffer);
  }
  GradScaler b(opts);
  {
    torch::serialize::InputArchive in;
    in.load_from(buffer);
    b.load(in);
  }
  EXPECT_EQ(b.hysteresis_tracker(), 1);
  EXPECT_EQ(b.skipped_steps(), 2);
  EXPECT_EQ(trajectory(a, "NFFF"), trajectory(b, "NFFF"));
  EXPECT_EQ(b.get_scale(), 64.0);  // 32 after the backoff, then one growth
}

TEST(Copy, CopiesAreIndependent) {
  GradScaler a(GradScalerOptions().init_scale(8).growth_interval(3));
  trajectory(a, "FF");  // scale 8, tracker 2
  GradScaler b = a;
  EXPECT_EQ(trajectory(b, "F").back(), (ampp_test::Point{16, 0}));
  EXPECT_EQ(a.get_scale(), 8.0);  // untouched by b's growth
  EXPECT_EQ(a.get_growth_tracker(), 2);
  GradScaler c;
  c = b;
  trajectory(c, "N");
  EXPECT_EQ(c.get_scale(), 8.0);
  EXPECT_EQ(b.get_scale(), 16.0);
  GradScaler moved = std::move(c);
  EXPECT_EQ(moved.get_scale(), 8.0);
}

}  // namespace
