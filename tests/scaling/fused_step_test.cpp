// GradScaler's fused path (FusedSGD, FusedAdamW): an iteration reads no tensor value on the host, the
// counters come out right when asked, the host rule still runs for ampp's policies, the floor holds
// on the device, and FusedAdamW's device step counts travel in checkpoints. PyTorch as the oracle:
// tests/oracle/fused_step_oracle_test.cpp.
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/util/torch_version.h>

#include <sstream>
#include <string_view>

#include "host_reads.h"
#include "scaler_test_util.h"

namespace {

using ampp_test::kInf;

#define AMPP_REQUIRE_FUSED_KERNELS() \
  if (!AMPP_TORCH_AT_LEAST(2, 4)) GTEST_SKIP() << "ATen's fused optimizer kernels need LibTorch 2.4 or newer"

struct Problem {
  std::vector<torch::Tensor> params{torch::linspace(-1, 1, 8).requires_grad_(),
                                    torch::linspace(0.5, 2, 16).reshape({4, 4}).requires_grad_()};

  // scale(loss).backward(), a non-finite gradient entry when `overflow`, step, update.
  void iterate(ampp::GradScaler& scaler, torch::optim::Optimizer& opt, bool overflow) {
    opt.zero_grad();
    auto loss = (params[0] * params[0]).sum() + params[1].sum() * 0.25;
    scaler.scale(loss).backward();
    if (overflow) params[1].mutable_grad()[1][2].fill_(kInf);
    scaler.step(opt);
    scaler.update();
  }
};

bool overflows_at(int step) { return step == 2 || step == 5 || step == 6; }

}  // namespace

TEST(FusedStep, AnIterationReadsNothingOnTheHostAndTheCountersComeOutOnRequest) {
  AMPP_REQUIRE_FUSED_KERNELS();
  for (const bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "FusedAdamW" : "FusedSGD");
    Problem problem;
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (adamw)
      opt = std::make_unique<ampp::FusedAdamW>(problem.params, torch::optim::AdamWOptions(1e-2));
    else
      opt = std::make_unique<ampp::FusedSGD>(problem.params, torch::optim::SGDOptions(1e-2).momentum(0.9));
    ampp::GradScaler scaler(ampp::GradScalerOptions().growth_interval(2));
    int reads = 0;
    {
      ampp_test::HostReadCounter counter;
      for (int s = 0; s < 10; ++s) problem.iterate(scaler, *opt, overflows_at(s));
      reads = counter.count();
    }
    EXPECT_EQ(reads, 0) << "host reads in 10 iterations";
    EXPECT_EQ(scaler.skipped_steps(), 3);
    EXPECT_FALSE(scaler.found_inf_last_step());
    EXPECT_EQ(scaler.consecutive_overflows(), 0);
    for (const auto& p : problem.params) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
}

TEST(FusedStep, ThePlainOptimizerPathReadsTheFlagEveryStep) {
  Problem problem;
  torch::optim::SGD opt(problem.params, torch::optim::SGDOptions(1e-2).momentum(0.9));
  ampp::GradScaler scaler;
  ampp_test::HostReadCounter counter;
  for (int s = 0; s < 5; ++s) problem.iterate(scaler, opt, overflows_at(s));
  EXPECT_GE(counter.count(), 5) << "the counter sees the reads that the fused path avoids";
}

// hysteresis and max_scale need the host rule: the fused step stays, update() reads the flag, and the
// scale follows the same trajectory as with the plain optimizer.
TEST(FusedStep, PoliciesBeyondPyTorchFallBackToTheHostRuleWithTheSameTrajectory) {
  AMPP_REQUIRE_FUSED_KERNELS();
  const auto options = ampp::GradScalerOptions().growth_interval(1).hysteresis(2).max_scale(1 << 18);
  Problem fused_problem, plain_problem;
  ampp::FusedSGD fused(fused_problem.params, torch::optim::SGDOptions(1e-2));
  torch::optim::SGD plain(plain_problem.params, torch::optim::SGDOptions(1e-2));
  ampp::GradScaler fused_scaler(options), plain_scaler(options);
  for (int s = 0; s < 12; ++s) {
    fused_problem.iterate(fused_scaler, fused, overflows_at(s));
    plain_problem.iterate(plain_scaler, plain, overflows_at(s));
    ASSERT_EQ(fused_scaler.get_scale(), plain_scaler.get_scale()) << "step " << s;
    ASSERT_EQ(fused_scaler.hysteresis_tracker(), plain_scaler.hysteresis_tracker()) << "step " << s;
  }
  EXPECT_EQ(fused_scaler.skipped_steps(), plain_scaler.skipped_steps());
}

// Every step overflows from a scale near the floor: the device-side update stops at kMinLossScale, as
// the host rule does, and no weight moves.
TEST(FusedStep, TheScaleStopsAtTheFloorOnTheDevice) {
  AMPP_REQUIRE_FUSED_KERNELS();
  Problem problem;
  const auto before = problem.params[0].detach().clone();
  ampp::FusedSGD opt(problem.params, torch::optim::SGDOptions(1e-2).momentum(0.9));
  ampp::GradScaler scaler(ampp::GradScalerOptions().init_scale(0x1p-123));
  for (int s = 0; s < 8; ++s) problem.iterate(scaler, opt, /*overflow=*/true);
  EXPECT_EQ(scaler.get_scale(), ampp::kMinLossScale);
  EXPECT_EQ(scaler.consecutive_overflows(), 8);
  EXPECT_EQ(scaler.skipped_steps(), 8);
  EXPECT_TRUE(torch::equal(problem.params[0].detach(), before));
}

// FusedAdamW keeps its step counts on the device; a checkpoint carries them as AdamW's, so it loads
// into torch::optim::AdamW, and a FusedAdamW that loads it continues exactly where the first was.
TEST(FusedAdamW, ACheckpointCarriesTheDeviceStepCounts) {
  AMPP_REQUIRE_FUSED_KERNELS();
  Problem a;
  ampp::FusedAdamW opt(a.params, torch::optim::AdamWOptions(1e-2));
  ampp::GradScaler scaler;
  for (int s = 0; s < 8; ++s) a.iterate(scaler, opt, overflows_at(s));
  std::ostringstream saved;
  {
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    archive.save_to(saved);
  }
  const auto load_into = [&saved](torch::optim::Optimizer& target) {
    std::istringstream in(saved.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    target.load(archive);
  };
  Problem b;
  torch::optim::AdamW plain(b.params, torch::optim::AdamWOptions(1e-2));
  load_into(plain);
  for (const auto& p : b.params)
    EXPECT_EQ(static_cast<torch::optim::AdamWParamState&>(*plain.state().at(ampp::optimizer_state_key(p))).step(), 5);

  Problem c;
  for (size_t i = 0; i < c.params.size(); ++i) c.params[i].detach().copy_(a.params[i].detach());
  ampp::FusedAdamW resumed(c.params, torch::optim::AdamWOptions(1e-2));
  load_into(resumed);
  ampp::GradScaler scaler_a = scaler, scaler_c = scaler;
  a.iterate(scaler_a, opt, false);
  c.iterate(scaler_c, resumed, false);
  for (size_t i = 0; i < a.params.size(); ++i) EXPECT_TRUE(torch::equal(a.params[i], c.params[i])) << "parameter " << i;
}

// Without a GradScaler: a closure runs with autograd on and its loss is returned, and the step is
// torch::optim::SGD's (the same update rule; ATen's fused kernel may round differently).
TEST(FusedSGD, AClosureRunsWithAutogradAndTheStepIsSgds) {
  AMPP_REQUIRE_FUSED_KERNELS();
  Problem fused_problem, plain_problem;
  ampp::FusedSGD fused(fused_problem.params, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  torch::optim::SGD plain(plain_problem.params, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  const auto closure_of = [](Problem& p, torch::optim::Optimizer& opt) {
    return [&p, &opt] {
      opt.zero_grad();
      auto loss = (p.params[0] * p.params[0]).sum() + p.params[1].pow(3).sum();
      loss.backward();
      return loss;
    };
  };
  torch::NoGradGuard outside;  // the optimizer must turn autograd on for the closure itself
  for (int s = 0; s < 3; ++s) {
    const auto fused_loss = fused.step(closure_of(fused_problem, fused));
    const auto plain_loss = plain.step(closure_of(plain_problem, plain));
    ASSERT_TRUE(fused_loss.defined());
    EXPECT_NEAR(fused_loss.item<double>(), plain_loss.item<double>(), 1e-5) << "step " << s;
  }
  for (size_t i = 0; i < fused_problem.params.size(); ++i)
    EXPECT_TRUE(torch::allclose(fused_problem.params[i], plain_problem.params[i], 1e-6, 1e-6)) << "parameter " << i;
}

// Reading the counters between steps keeps the device's counts going (a captured CUDA graph goes on
// updating the same tensors: cuda_graph_step.h), and a plain optimizer's iteration between fused ones
// continues the same counts: all as a scaler that only ever takes the plain path.
TEST(FusedStep, CountersStayRightWhenReadBetweenStepsAndAcrossBothPaths) {
  AMPP_REQUIRE_FUSED_KERNELS();
  Problem mixed_problem, plain_problem;
  ampp::FusedSGD fused(mixed_problem.params, torch::optim::SGDOptions(1e-2));
  torch::optim::SGD plain_on_the_same(mixed_problem.params, torch::optim::SGDOptions(1e-2));
  torch::optim::SGD plain(plain_problem.params, torch::optim::SGDOptions(1e-2));
  ampp::GradScaler mixed_scaler(ampp::GradScalerOptions().growth_interval(2)),
      plain_scaler(ampp::GradScalerOptions().growth_interval(2));
  for (int s = 0; s < 12; ++s) {
    const bool overflow = s == 2 || s == 3 || s == 4 || s == 8;
    torch::optim::Optimizer& opt = s % 3 == 1 ? static_cast<torch::optim::Optimizer&>(plain_on_the_same) : fused;
    mixed_problem.iterate(mixed_scaler, opt, overflow);
    plain_problem.iterate(plain_scaler, plain, overflow);
    if (s % 4 == 3) continue;  // some steps are not read: their counts are folded with the next ones
    ASSERT_EQ(mixed_scaler.consecutive_overflows(), plain_scaler.consecutive_overflows()) << "step " << s;
    ASSERT_EQ(mixed_scaler.skipped_steps(), plain_scaler.skipped_steps()) << "step " << s;
    ASSERT_EQ(mixed_scaler.found_inf_last_step(), plain_scaler.found_inf_last_step()) << "step " << s;
    ASSERT_EQ(mixed_scaler.get_scale(), plain_scaler.get_scale()) << "step " << s;
  }
  EXPECT_EQ(mixed_scaler.skipped_steps(), 4);
}

// A tensor lr (what a CUDA graph replays with new values) steps as the same double lr, bit for bit on the
// CPU in float64, and changing the tensor's value changes the next step's lr; a tensor of the wrong shape is
// refused by name.
TEST(FusedStep, AnLrTensorStepsAsTheSameDoubleLr) {
  AMPP_REQUIRE_FUSED_KERNELS();
  for (const bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "FusedAdamW" : "FusedSGD");
    Problem with_double, with_tensor;
    auto make = [&](Problem& p) -> std::unique_ptr<torch::optim::Optimizer> {
      if (adamw) return std::make_unique<ampp::FusedAdamW>(p.params, torch::optim::AdamWOptions(1e-2));
      return std::make_unique<ampp::FusedSGD>(p.params, torch::optim::SGDOptions(1e-2).momentum(0.9));
    };
    auto by_double = make(with_double), by_tensor = make(with_tensor);
    auto lr = torch::zeros({}, torch::kDouble);
    dynamic_cast<ampp::GradScaleAwareOptimizer&>(*by_tensor).set_lr_tensor(lr);
    ampp::GradScaler a, b;
    for (int s = 0; s < 6; ++s) {
      const double value = 1e-2 / (s + 1);  // a new lr every step, as the cosine schedule
      for (auto& group : by_double->param_groups()) group.options().set_lr(value);
      lr.fill_(value);
      with_double.iterate(a, *by_double, overflows_at(s));
      with_tensor.iterate(b, *by_tensor, overflows_at(s));
    }
    for (size_t i = 0; i < with_double.params.size(); ++i)
      EXPECT_TRUE(torch::equal(with_double.params[i], with_tensor.params[i])) << i;
    dynamic_cast<ampp::GradScaleAwareOptimizer&>(*by_tensor).set_lr_tensor(torch::zeros({1}));
    try {
      with_tensor.iterate(b, *by_tensor, false);
      ADD_FAILURE() << "a 1-element, 1-dimensional lr was taken";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("the lr must be a 0-dim floating-point tensor"), std::string::npos)
          << e.what();
    }
  }
}
