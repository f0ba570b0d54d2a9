// O0..O3 train the reference CNN with BatchNorm on seeded synthetic data (the seed 001/004 loop).
#include <ampp/amp/initialize.h>

#include "amp/reference_nets.h"
#include "ampp_test.h"

#include <ampp/util/optimizer_compat.h>
#include <torch/torch.h>

#include <functional>
#include <sstream>

using ampp::OptLevel;
using ampp::Properties;
using ampp_test::RefCnn;
using ampp_test::SyntheticImages;

namespace {

constexpr int64_t kSide = 12, kBatch = 64, kSteps = 24;

const SyntheticImages& data() {
  static const SyntheticImages d = SyntheticImages::make(512, kSide, 10, /*seed=*/7, /*noise=*/2.0);
  return d;
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

std::unique_ptr<torch::optim::Optimizer> sgd(std::vector<torch::Tensor> p) {
  return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
}
std::unique_ptr<torch::optim::Optimizer> adam(std::vector<torch::Tensor> p) {
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(2e-3));
}
std::unique_ptr<torch::optim::Optimizer> adamw(std::vector<torch::Tensor> p) {
  return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(2e-3).weight_decay(0.01));
}

// Every low-precision model parameter equals its FP32 master rounded to the model's dtype.
void expect_in_sync(const RefCnn& net, const ampp::Amp& amp, const torch::optim::Optimizer& opt) {
  const auto model = net->parameters();
  const auto masters = amp.master_params(opt);
  ASSERT_EQ(model.size(), masters.size());
  for (size_t i = 0; i < model.size(); ++i) {
    ASSERT_EQ(masters[i].scalar_type(), torch::kFloat);
    if (model[i].is_same(masters[i])) continue;  // FP32 BatchNorm parameter: its own master
    auto expected =
        amp.fp16_emulated() ? masters[i].to(torch::kHalf).to(torch::kFloat) : masters[i].to(model[i].scalar_type());
    EXPECT_TRUE(torch::equal(model[i].detach(), expected)) << "parameter " << i;
  }
}

struct TrainRun {
  double first_loss = 0, eval_loss = 0;
};

TrainRun train(const Properties& props, const MakeOptimizer& make_opt = sgd, bool check_sync = false) {
  torch::manual_seed(42);  // same initial weights for every level
  RefCnn net(kSide);
  auto opt = make_opt(net->parameters());
  auto amp = ampp::initialize(net, *opt, Properties(props).verbosity(0));
  TrainRun run;
  const auto& d = data();
  for (int64_t step = 0; step < kSteps; ++step) {
    const int64_t start = (step * kBatch) % d.images.size(0);
    auto x = d.images.narrow(0, start, kBatch), y = d.labels.narrow(0, start, kBatch);
    opt->zero_grad();  // seed 001 calls optimizer.zero_grad() directly: works at every level
    auto loss = torch::nn::functional::cross_entropy(amp.forward(net, x), y);
    if (step == 0) run.first_loss = loss.item<double>();
    amp.scale_loss(loss).backward();
    amp.step();
    if (check_sync) expect_in_sync(net, amp, *opt);
  }
  net->eval();
  torch::NoGradGuard no_grad;
  run.eval_loss = torch::nn::functional::cross_entropy(amp.forward(net, d.images), d.labels).item<double>();
  return run;
}

}  // namespace

class TrainLevels : public ::testing::TestWithParam<c10::ScalarType> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_P(TrainLevels, O1AndO2WithinTenPercentOfO0) {
  const auto dtype = GetParam();
  const TrainRun o0 = train(Properties("O0"));
  const TrainRun o1 = train(Properties("O1").dtype(dtype));
  const TrainRun o2 = train(Properties("O2").dtype(dtype), sgd, /*check_sync=*/true);
  const TrainRun o3 = train(Properties("O3").dtype(dtype));
  // Training worked at all: O0 went well below chance level (ln 10 = 2.30).
  EXPECT_LT(o0.eval_loss, 0.6 * o0.first_loss);
  EXPECT_NEAR(o1.eval_loss, o0.eval_loss, 0.10 * o0.eval_loss);
  EXPECT_NEAR(o2.eval_loss, o0.eval_loss, 0.10 * o0.eval_loss);
  // O3 is the speed baseline: it must train, but no accuracy bound is promised.
  EXPECT_TRUE(std::isfinite(o3.eval_loss));
  EXPECT_LT(o3.eval_loss, o3.first_loss);
  std::cout << c10::toString(dtype) << " eval loss O0 " << o0.eval_loss << " O1 " << o1.eval_loss << " O2 "
            << o2.eval_loss << " O3 " << o3.eval_loss << "\n";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TrainLevels, ::testing::Values(torch::kBFloat16, torch::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(TrainOptimizers, O2WorksWithSgdMomentumAdamAndAdamW) {
  at::set_num_threads(1);
  const TrainRun ref = train(Properties("O0"), adam);
  for (const auto& [name, make] :
       std::vector<std::pair<std::string, MakeOptimizer>>{{"sgd", sgd}, {"adam", adam}, {"adamw", adamw}}) {
    const TrainRun run = train(Properties("O2"), make, /*check_sync=*/true);
    EXPECT_LT(run.eval_loss, 0.85 * run.first_loss) << name;  // it trains (24 steps, eval-mode BN)
    if (name == "adam") EXPECT_NEAR(run.eval_loss, ref.eval_loss, 0.10 * ref.eval_loss);
  }
}

TEST(TrainOptimizers, O2OptimizerStateLivesWithTheMasters) {
  RefCnn net(kSide);
  torch::optim::Adam opt(net->parameters());
  auto amp = ampp::initialize(net, opt, Properties("O2").verbosity(0));
  auto loss = torch::nn::functional::cross_entropy(amp.forward(net, data().images.narrow(0, 0, 8)),
                                                   data().labels.narrow(0, 0, 8));
  amp.scale_loss(loss).backward();
  // After backward: FP32 unscaled grads on the masters, none left on the bf16 model.
  for (const auto& p : net->parameters()) {
    if (p.scalar_type() == torch::kBFloat16) EXPECT_FALSE(p.grad().defined());
  }
  for (const auto& m : amp.master_params(opt)) EXPECT_EQ(m.grad().scalar_type(), torch::kFloat);
  ASSERT_TRUE(amp.step());
  ASSERT_EQ(opt.state().size(), net->parameters().size());
  for (const auto& m : amp.master_params(opt)) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*opt.state().at(ampp::optimizer_state_key(m)));
    EXPECT_EQ(s.exp_avg().scalar_type(), torch::kFloat);
    EXPECT_EQ(s.step(), 1);
  }
  // BatchNorm parameters are still FP32 after training steps.
  EXPECT_EQ(net->bn1->weight.scalar_type(), torch::kFloat);
  EXPECT_EQ(net->bn2->running_mean.scalar_type(), torch::kFloat);
}

// The master gradients under O2 are the FP32 gradients up to the bf16 rounding of the forward and
// backward passes: as close to them as O1's (autocast only) are. A wrong unscale would be off by 2^16.
TEST(TrainOptimizers, O2MasterGradsMatchFp32Grads) {
  at::set_num_threads(1);
  auto grads = [](const char* level) {
    torch::manual_seed(5);
    RefCnn net(kSide);
    torch::optim::SGD opt(net->parameters(), 0.1);
    auto amp = ampp::initialize(net, opt, Properties(level).verbosity(0));
    auto loss = torch::nn::functional::cross_entropy(amp.forward(net, data().images.narrow(0, 0, 64)),
                                                     data().labels.narrow(0, 0, 64));
    amp.scale_loss(loss).backward();
    std::vector<torch::Tensor> out;
    for (const auto& m : amp.master_params(opt)) out.push_back(m.grad().clone());
    return out;
  };
  const auto fp32 = grads("O0"), o1 = grads("O1"), o2 = grads("O2");
  ASSERT_EQ(fp32.size(), o2.size());
  auto rel = [&](const std::vector<torch::Tensor>& g, size_t i) {
    return (g[i] - fp32[i]).norm().item<double>() / fp32[i].norm().item<double>();
  };
  for (size_t i = 0; i < fp32.size(); ++i) {
    if (i == 1 || i == 5) continue;  // conv biases feeding BatchNorm: their true gradient is ~0
    std::cout << "param " << i << " rel err O1 " << rel(o1, i) << " O2 " << rel(o2, i) << "\n";
    EXPECT_LT(rel(o2, i), 0.15) << "parameter " << i;
    EXPECT_LT(rel(o2, i), 2.0 * rel(o1, i) + 0.01) << "parameter " << i;
  }
}

// Save model + optimizer + amp state, restore into a fresh O2 setup: both continue identically.
TEST(StateDict, O2RoundTripKeepsMastersAndModelInSync) {
  at::set_num_threads(1);
  auto make = [](uint64_t seed) {
    torch::manual_seed(seed);
    return RefCnn(kSide);
  };
  auto step = [](RefCnn& net, ampp::Amp& amp, torch::optim::Optimizer& opt, int64_t start) {
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(amp.forward(net, data().images.narrow(0, start, 32)),
                                                     data().labels.narrow(0, start, 32));
    amp.scale_loss(loss).backward();
    amp.step();
  };
  RefCnn a = make(1);
  torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto amp_a = ampp::initialize(a, opt_a, Properties("O2").verbosity(0));
  for (int i = 0; i < 3; ++i) step(a, amp_a, opt_a, 32 * i);

  std::stringstream model_buf, opt_buf;
  torch::save(a, model_buf);
  torch::save(opt_a, opt_buf);
  const auto amp_sd = amp_a.state_dict();
  ASSERT_TRUE(amp_sd.contains("loss_scaler0"));
  ASSERT_TRUE(amp_sd.contains("master_params"));
  EXPECT_EQ(amp_sd.at("loss_scaler0").toGenericDict().at("loss_scale").toDouble(), 65536.0);
  EXPECT_EQ(amp_sd.at("loss_scaler0").toGenericDict().at("unskipped").toInt(), 3);

  RefCnn b = make(2);  // different initial weights: everything must come from the checkpoint
  torch::optim::SGD opt_b(b->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto amp_b = ampp::initialize(b, opt_b, Properties("O2").verbosity(0));
  torch::load(b, model_buf);
  torch::load(opt_b, opt_buf);
  amp_b.load_state_dict(amp_sd);
  expect_in_sync(b, amp_b, opt_b);
  const auto ma = amp_a.master_params(opt_a), mb = amp_b.master_params(opt_b);
  for (size_t i = 0; i < ma.size(); ++i) EXPECT_TRUE(torch::equal(ma[i], mb[i])) << i;  // full FP32 restored
  EXPECT_EQ(amp_b.scaler().get_growth_tracker(), 3);

  step(a, amp_a, opt_a, 96);
  step(b, amp_b, opt_b, 96);
  expect_in_sync(b, amp_b, opt_b);
  const auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
}

TEST(StateDict, WithoutMastersTheyFollowTheLoadedModel) {
  RefCnn a(kSide), b(kSide);
  torch::optim::SGD opt_a(a->parameters(), 0.1), opt_b(b->parameters(), 0.1);
  auto amp_a = ampp::initialize(a, opt_a, Properties("O2").verbosity(0));
  auto amp_b = ampp::initialize(b, opt_b, Properties("O2").verbosity(0));
  std::stringstream buf;
  torch::save(a, buf);
  torch::load(b, buf);
  auto sd = amp_a.state_dict();
  (void)sd.erase("master_params");  // an apex-style dict: loss scalers only
  amp_b.load_state_dict(sd);
  expect_in_sync(b, amp_b, opt_b);
  const auto ma = amp_a.master_params(opt_a), mb = amp_b.master_params(opt_b);
  for (size_t i = 0; i < ma.size(); ++i) EXPECT_TRUE(torch::equal(ma[i], mb[i])) << i;
}

TEST(StateDict, BadDictsAreRejected) {
  RefCnn net(kSide);
  torch::optim::SGD opt(net->parameters(), 0.1);
  auto o2 = ampp::initialize(net, opt, Properties("O2").verbosity(0));
  auto sd = o2.state_dict();
  sd.insert("bogus", 1.0);
  AMPP_EXPECT_THROW_WITH(o2.load_state_dict(sd), "Unexpected key(s) in state_dict: bogus");
  (void)sd.erase("bogus");
  auto masters = sd.at("master_params").toTensorVector();
  masters.pop_back();
  sd.insert_or_assign("master_params", masters);
  AMPP_EXPECT_THROW_WITH(o2.load_state_dict(sd), "Was it saved from a different model?");

  RefCnn other(kSide);
  torch::optim::SGD opt1(other->parameters(), 0.1);
  auto o1 = ampp::initialize(other, opt1, Properties("O1").verbosity(0));
  AMPP_EXPECT_THROW_WITH(o1.load_state_dict(o2.state_dict()), "this handle has none");
}
