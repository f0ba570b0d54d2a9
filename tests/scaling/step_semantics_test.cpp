// What step() does to parameters and optimizer state: skipped steps are bit-for-bit no-ops, finite
// steps equal plain steps on the true gradients, clipping after unscale_ sees the true gradients
// (seed 003), enabled(false) is a pass-through; plus a small bf16-autocast training run.

#include "scaler_test_util.h"

#include <ampp/precision/torch_compat.h>
#include <ampp/util/optimizer_compat.h>
#include <ampp/util/torch_version.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace {

using ampp::GradScaler;
using ampp::GradScalerOptions;
using ampp_test::same_bits;
using ampp_test::snapshot;

torch::nn::Sequential make_mlp(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
}

struct Batch {
  torch::Tensor x, y;
};

Batch make_batch(uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({8, 6}), torch::randn({8, 3})};
}

// Every tensor of the optimizer's per-parameter state, in parameter order.
std::vector<torch::Tensor> optimizer_state(torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      auto it = opt.state().find(ampp::optimizer_state_key(p));
      if (it == opt.state().end()) continue;
      if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        out.push_back(sgd->momentum_buffer().clone());
      } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        out.push_back(torch::tensor(adam->step()));
        out.push_back(adam->exp_avg().clone());
        out.push_back(adam->exp_avg_sq().clone());
      }
    }
  }
  return out;
}

using OptFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

std::vector<std::pair<std::string, OptFactory>> optimizers() {
  return {
      {"SGD momentum",
       [](std::vector<torch::Tensor> ps) {
         return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1).momentum(0.9));
       }},
      {"Adam",
       [](std::vector<torch::Tensor> ps) {
         return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-2));
       }},
  };
}

TEST(Step, NonFiniteGradientInAnyParameterLeavesParamsAndOptimizerStateBitIdentical) {
  for (auto& [name, factory] : optimizers()) {
    auto net = make_mlp(1);
    auto params = net->parameters();
    auto opt = factory(params);
    GradScaler scaler;
    auto iterate = [&](int64_t bad_param, float bad_value, uint64_t seed) {
      opt->zero_grad();
      auto b = make_batch(seed);
      scaler.scale(torch::mse_loss(net->forward(b.x), b.y)).backward();
      if (bad_param >= 0) {
        auto g = params[static_cast<size_t>(bad_param)].mutable_grad();
        g.view(-1)[g.numel() - 1].fill_(bad_value);  // last element: the kernel's scalar tail
      }
      const bool stepped = scaler.step(*opt);
      scaler.update();
      return stepped;
    };
    ASSERT_TRUE(iterate(-1, 0, 10));  // build optimizer state first
    ASSERT_TRUE(iterate(-1, 0, 11));
    double expected_scale = 65536;
    for (size_t k = 0; k < params.size(); ++k) {
      for (float bad : {ampp_test::kInf, -ampp_test::kInf, ampp_test::kNaN}) {
        const auto params_before = snapshot(params);
        const auto state_before = optimizer_state(*opt);
        ASSERT_FALSE(state_before.empty());
        EXPECT_FALSE(iterate(static_cast<int64_t>(k), bad, 20 + k));
        EXPECT_TRUE(same_bits(snapshot(params), params_before)) << name << " param " << k << " " << bad;
        EXPECT_TRUE(same_bits(optimizer_state(*opt), state_before)) << name << " param " << k;
        expected_scale /= 2;
        EXPECT_EQ(scaler.get_scale(), expected_scale);
        EXPECT_TRUE(scaler.found_inf_last_step());
      }
    }
    EXPECT_EQ(scaler.skipped_steps(), static_cast<int64_t>(3 * params.size()));
  }
}

TEST(Step, FiniteStepsEqualPlainStepsOnUnscaledGradientsBitForBit) {
  for (auto& [name, factory] : optimizers()) {
    auto plain_net = make_mlp(2), amp_net = make_mlp(2);
    auto plain_opt = factory(plain_net->parameters());
    auto amp_opt = factory(amp_net->parameters());
    GradScaler scaler;  // 2^16: a power of two, so scaling and unscaling are exact in fp32
    for (uint64_t it = 0; it < 4; ++it) {
      auto b = make_batch(100 + it);
      plain_opt->zero_grad();
      torch::mse_loss(plain_net->forward(b.x), b.y).backward();
      plain_opt->step();

      amp_opt->zero_grad();
      scaler.scale(torch::mse_loss(amp_net->forward(b.x), b.y)).backward();
      EXPECT_TRUE(scaler.step(*amp_opt));
      EXPECT_FALSE(scaler.found_inf_last_step());
      scaler.update();
      EXPECT_TRUE(same_bits(snapshot(amp_net->parameters()), snapshot(plain_net->parameters())))
          << name << " iteration " << it;
      EXPECT_TRUE(same_bits(optimizer_state(*amp_opt), optimizer_state(*plain_opt))) << name;
    }
    EXPECT_EQ(scaler.get_growth_tracker(), 4);
  }
}

// Seed 003 (insightface): features.backward(scaler.scale(x_grad)); unscale_(opt_backbone);
// clip_grad_norm_(backbone, 5); step(opt_backbone); update(); opt_pfc.step() without the scaler.
TEST(Step, Seed003ClipGradNormAfterUnscaleClipsTheTrueGradients) {
  struct Run {
    torch::nn::Linear backbone;
    torch::Tensor head;
    torch::optim::SGD opt_backbone, opt_pfc;
    explicit Run(uint64_t seed)
        : backbone((torch::manual_seed(seed), torch::nn::Linear(6, 8))),
          head(torch::randn({8, 4}).requires_grad_()),
          opt_backbone(backbone->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)),
          opt_pfc(std::vector<torch::Tensor>{head}, torch::optim::SGDOptions(0.1)) {}
    // The partial-FC forward_backward: loss on detached features, returns d loss / d features.
    torch::Tensor forward_backward(const torch::Tensor& features, const torch::Tensor& labels) {
      auto f = features.detach().requires_grad_();
      auto loss = 200.0 * torch::cross_entropy_loss(f.mm(head), labels);  // big: clipping must act
      loss.backward();
      return f.grad();
    }
  };
  Run ref(3), amp(3);
  GradScaler scaler(GradScalerOptions().init_scale(4096).growth_interval(100));
  for (uint64_t it = 0; it < 3; ++it) {
    torch::manual_seed(50 + it);
    auto img = torch::randn({16, 6});
    auto label = torch::randint(0, 4, {16});

    auto features = torch::nn::functional::normalize(ref.backbone->forward(img));
    features.backward(ref.forward_backward(features, label));
    const double ref_norm = torch::nn::utils::clip_grad_norm_(ref.backbone->parameters(), 5.0);
    std::vector<torch::Tensor> ref_grads;
    for (auto& p : ref.backbone->parameters()) ref_grads.push_back(p.grad().clone());
    ref.opt_backbone.step();
    ref.opt_pfc.step();
    ref.opt_backbone.zero_grad();
    ref.opt_pfc.zero_grad();

    auto amp_features = torch::nn::functional::normalize(amp.backbone->forward(img));
    auto x_grad = amp.forward_backward(amp_features, label);
    amp_features.backward(scaler.scale(x_grad));
    scaler.unscale_(amp.opt_backbone);
    const double amp_norm = torch::nn::utils::clip_grad_norm_(amp.backbone->parameters(), 5.0);
    EXPECT_GT(ref_norm, 5.0) << "the test must exercise clipping";
    EXPECT_EQ(amp_norm, ref_norm) << "clip_grad_norm_ must see unscaled gradients";
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(same_bits(amp.backbone->parameters()[i].grad(), ref_grads[i]));
    }
    EXPECT_TRUE(scaler.step(amp.opt_backbone));
    scaler.update();
    amp.opt_pfc.step();
    amp.opt_backbone.zero_grad();
    amp.opt_pfc.zero_grad();
    EXPECT_TRUE(same_bits(snapshot(amp.backbone->parameters()), snapshot(ref.backbone->parameters())));
  }
}

TEST(Step, DisabledScalerIsAnExactPassThrough) {
  // Invalid factors are not even validated when disabled (as in PyTorch).
  GradScaler scaler(GradScalerOptions().enabled(false).growth_factor(0.5));
  EXPECT_FALSE(scaler.is_enabled());
  auto plain_net = make_mlp(4), off_net = make_mlp(4);
  torch::optim::SGD plain_opt(plain_net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD off_opt(off_net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (uint64_t it = 0; it < 2; ++it) {
    auto b = make_batch(200 + it);
    plain_opt.zero_grad();
    torch::mse_loss(plain_net->forward(b.x), b.y).backward();
    plain_opt.step();

    off_opt.zero_grad();
    auto loss = torch::mse_loss(off_net->forward(b.x), b.y);
    auto scaled = scaler.scale(loss);
    EXPECT_TRUE(scaled.is_same(loss));
    EXPECT_EQ(scaler.scale(std::vector<torch::Tensor>{loss})[0].unsafeGetTensorImpl(), loss.unsafeGetTensorImpl());
    scaled.backward();
    const auto grads = snapshot({off_net->parameters()[0].grad()});
    scaler.unscale_(off_opt);
    scaler.unscale_(off_opt);  // no state machine when disabled
    EXPECT_TRUE(same_bits(off_net->parameters()[0].grad(), grads[0]));
    EXPECT_TRUE(scaler.step(off_opt));
    scaler.update();
    scaler.update(7.0);
    EXPECT_TRUE(same_bits(snapshot(off_net->parameters()), snapshot(plain_net->parameters())));
  }
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_TRUE(scaler.state_dict().empty());
  scaler.load_state_dict(ampp::make_state_dict());  // no-op, no error
  // Closures pass through to the optimizer.
  int calls = 0;
  EXPECT_TRUE(scaler.step(off_opt, [&] {
    ++calls;
    return torch::zeros({});
  }));
  EXPECT_EQ(calls, 1);
}

TEST(Step, SparseGradientsAreUnscaledThroughTheirValues) {
  torch::manual_seed(5);
  auto make = [] {
    torch::manual_seed(5);
    return torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 3).sparse(true));
  };
  auto ref = make(), amp = make();
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.5));
  torch::optim::SGD amp_opt(amp->parameters(), torch::optim::SGDOptions(0.5));
  auto idx = torch::tensor({1, 4, 4, 9}, torch::kLong);
  ref->forward(idx).pow(2).sum().backward();
  ref_opt.step();
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  scaler.scale(amp->forward(idx).pow(2).sum()).backward();
  ASSERT_TRUE(amp->weight.grad().is_sparse());
  EXPECT_TRUE(scaler.step(amp_opt));
  scaler.update();
  EXPECT_TRUE(same_bits(amp->weight.detach(), ref->weight.detach()));

  amp_opt.zero_grad();
  scaler.scale(amp->forward(idx).sum()).backward();
  amp->weight.mutable_grad()._values()[0][0].fill_(ampp_test::kInf);
  const auto before = amp->weight.detach().clone();
  EXPECT_FALSE(scaler.step(amp_opt));
  scaler.update();
  EXPECT_TRUE(same_bits(amp->weight.detach(), before));
  EXPECT_EQ(scaler.get_scale(), 512.0);
}

TEST(Step, Bf16GradientsAreUnscaledAndChecked) {
  auto p = torch::ones({5}, torch::kBFloat16).requires_grad_();
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(1.0));
  GradScaler scaler(GradScalerOptions().init_scale(256));
  scaler.scale((p * torch::arange(1, 6).to(torch::kBFloat16)).sum()).backward();
  scaler.unscale_(opt);
  EXPECT_TRUE(torch::equal(p.grad(), torch::arange(1, 6).to(torch::kBFloat16)));
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_TRUE(torch::equal(p.detach(), (1 - torch::arange(1, 6)).to(torch::kBFloat16)));
  opt.zero_grad();
  scaler.scale(p.sum()).backward();
  p.mutable_grad()[4].fill_(ampp_test::kNaN);
  EXPECT_FALSE(scaler.step(opt));
}

// PyTorch 2.x returns a Half inf here (its 0-dim scale does not promote); ampp scales in float32
// (docs/grad_scaler.md). The values against Python PyTorch: GradScalerOracle.ScaleOfLowPrecisionOutputs.
TEST(Step, LowPrecisionOutputsAreScaledInFloat32) {
  GradScaler scaler;
  auto out = torch::full({3}, 1.5, torch::kHalf).requires_grad_();
  const auto scaled = scaler.scale(out);
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(scaled, torch::full({3}, 98304.0)));
  scaled.sum().backward();
  // The gradient comes back in the output's dtype: 65536 is above fp16's max, so it is inf, as the
  // same fp16 gradient is on a GPU (the scaler then skips the step and backs off).
  EXPECT_EQ(out.grad().scalar_type(), torch::kHalf);
  EXPECT_TRUE(torch::equal(out.grad(), torch::full({3}, 65536.0).to(torch::kHalf)));

  const auto loss = scaler.scale(torch::tensor(3.0, torch::kBFloat16));
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_EQ(loss.item<float>(), 196608.0f);
  // Shape as the PyTorch built against: 1.13's scale is (1,), 2.x's is 0-dim.
  EXPECT_EQ(loss.dim(), AMPP_TORCH_AT_LEAST(2, 0) ? 0 : 1);
  EXPECT_EQ(scaler.scale(torch::ones({2}, torch::kDouble)).scalar_type(), torch::kDouble);
}

TEST(Step, FoundInfHookSeesTheFlagAndDecidesForAllProcesses) {
  GradScaler scaler(GradScalerOptions().init_scale(8));
  int calls = 0;
  float seen = -1;
  bool other_rank_overflowed = true;
  scaler.set_found_inf_hook([&](torch::Tensor& found_inf) {
    ++calls;
    seen = found_inf.item<float>();
    if (other_rank_overflowed) found_inf.fill_(1.0);  // what an all-reduce(MAX) would produce
  });
  ampp_test::Tiny t;
  EXPECT_FALSE(t.iterate(scaler, false));  // locally finite, skipped because of the "other rank"
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, 0.0f);
  EXPECT_EQ(scaler.get_scale(), 4.0);
  other_rank_overflowed = false;
  EXPECT_FALSE(t.iterate(scaler, true));
  EXPECT_EQ(seen, 1.0f);
  EXPECT_TRUE(t.iterate(scaler, false));
  EXPECT_EQ(calls, 3);
  scaler.set_found_inf_hook(nullptr);
  EXPECT_TRUE(t.iterate(scaler, false));
  EXPECT_EQ(calls, 3);
}

// Seeded synthetic regression, bf16 CPU autocast (LibTorch's own) + GradScaler: the loss must fall
// at least 5x in a fixed number of steps.
TEST(Training, SmallMlpWithBf16AutocastAndScalerLearns) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  auto x = torch::randn({256, 8});
  auto w_true = torch::randn({8, 1});
  auto y = torch::sin(x.mm(w_true)) + 0.5 * x.narrow(1, 0, 1);
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Linear(8, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64), torch::nn::ReLU(),
                            torch::nn::Linear(64, 1));
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
  GradScaler scaler(GradScalerOptions().growth_interval(50));

  auto loss_at = [&](bool train) {
    torch::Tensor out;
    {
      // RAII-free autocast region, as torch.autocast would do: enable, forward, disable, clear cache.
      ampp::precision::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
      ampp::precision::compat::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
      out = net->forward(x);
      ampp::precision::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
      at::autocast::clear_cache();
    }
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);  // autocast really ran the linears in bf16
    auto loss = torch::mse_loss(out.to(torch::kFloat), y);
    if (train) {
      opt.zero_grad();
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
    }
    return loss.item<double>();
  };
  const double first = loss_at(false);
  for (int i = 0; i < 150; ++i) loss_at(true);
  const double last = loss_at(false);
  EXPECT_LT(last * 5.0, first) << "first " << first << " last " << last;
  EXPECT_EQ(scaler.skipped_steps(), 0);
  EXPECT_EQ(scaler.get_scale(), 65536.0 * 8);  // 150 clean steps / interval 50 = three doublings
}

}  // namespace
