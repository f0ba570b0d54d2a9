// initialize(): model casting with BatchNorm kept FP32, masters in the optimizer, and bad input.
#include <ampp/amp/initialize.h>

#include "amp/reference_nets.h"
#include "ampp_test.h"

#include <ampp/util/optimizer_compat.h>
#include <torch/torch.h>

using ampp::OptLevel;
using ampp::Properties;
using ampp_test::RefCnn;

namespace {

Properties quiet(Properties p) { return p.verbosity(0); }

}  // namespace

TEST(Initialize, O2CastsEverythingButAffineBatchNorm) {
  torch::manual_seed(0);
  RefCnn net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto amp = ampp::initialize(net, opt, quiet(OptLevel::O2));
  EXPECT_EQ(net->conv1->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(net->conv2->bias.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(net->fc->weight.scalar_type(), torch::kBFloat16);
  for (auto* bn : {net->bn1.get(), net->bn2.get()}) {
    EXPECT_EQ(bn->weight.scalar_type(), torch::kFloat);
    EXPECT_EQ(bn->bias.scalar_type(), torch::kFloat);
    EXPECT_EQ(bn->running_mean.scalar_type(), torch::kFloat);
    EXPECT_EQ(bn->running_var.scalar_type(), torch::kFloat);
  }
  EXPECT_EQ(amp.model_storage_dtype(), torch::kBFloat16);
}

TEST(Initialize, O2KeepsBatchNormOffWhenOverridden) {
  RefCnn net;
  torch::optim::SGD opt(net->parameters(), 0.1);
  ampp::initialize(net, opt, quiet(Properties("O2").keep_batchnorm_fp32(false)));
  EXPECT_EQ(net->bn1->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(net->bn1->running_var.scalar_type(), torch::kBFloat16);
}

TEST(Initialize, NonAffineBatchNormIsCastAsApexDoes) {
  auto seq = torch::nn::Sequential(torch::nn::Conv2d(1, 2, 3),
                                   torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(2).affine(false)));
  torch::optim::SGD opt(seq->parameters(), 0.1);
  ampp::initialize(seq.ptr(), opt, quiet(OptLevel::O2));
  auto* bn = seq[1]->as<torch::nn::BatchNorm2dImpl>();
  EXPECT_EQ(bn->running_mean.scalar_type(), torch::kBFloat16);
}

// The FP32 BatchNorm under O2 sees a bf16 input: LibTorch's batch_norm then computes in FP32 and
// rounds the output once, exactly "cast the input to FP32, run BN in FP32, cast the output back".
TEST(Initialize, O2BatchNormEqualsFp32BatchNormOnUpcastInput) {
  torch::manual_seed(1);
  torch::nn::BatchNorm2d mixed(4), reference(4);
  auto x = (torch::randn({8, 4, 5, 5}) * 3 + 1).to(torch::kBFloat16);
  auto y = mixed(x);
  auto expected = reference(x.to(torch::kFloat)).to(torch::kBFloat16);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(y, expected));
  EXPECT_TRUE(torch::equal(mixed->running_mean, reference->running_mean));
  EXPECT_TRUE(torch::allclose(mixed->running_var, reference->running_var, 1e-6, 1e-7));
}

TEST(Initialize, O2RepointsOptimizerAtFp32MastersAndMovesState) {
  torch::manual_seed(0);
  RefCnn net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  // Pre-existing momentum (e.g. loaded from a checkpoint before initialize) must follow the master.
  for (auto& p : net->parameters()) p.mutable_grad() = torch::ones_like(p);
  opt.step();
  const auto conv_w_fp32 = net->conv1->weight.detach().clone();
  const auto old_key = ampp::optimizer_state_key(net->conv1->weight);
  ASSERT_TRUE(opt.state().count(old_key));

  auto amp = ampp::initialize(net, opt, quiet(OptLevel::O2));
  const auto& params = opt.param_groups()[0].params();
  ASSERT_EQ(params.size(), net->parameters().size());
  const auto model_params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].scalar_type(), torch::kFloat) << i;
    EXPECT_TRUE(params[i].requires_grad());
    const bool bn = model_params[i].scalar_type() == torch::kFloat;
    // BN params are their own masters; the others are new FP32 copies of the bf16 model values.
    EXPECT_EQ(params[i].is_same(model_params[i]), bn) << i;
    EXPECT_TRUE(torch::equal(params[i], model_params[i].to(torch::kFloat))) << i;
  }
  // apex: masters start from the low-precision model values.
  EXPECT_TRUE(torch::equal(params[0], conv_w_fp32.to(torch::kBFloat16).to(torch::kFloat)));
  EXPECT_FALSE(opt.state().count(old_key));
  const auto new_key = ampp::optimizer_state_key(params[0]);
  ASSERT_TRUE(opt.state().count(new_key));
  auto& state = dynamic_cast<torch::optim::SGDParamState&>(*opt.state().at(new_key));
  EXPECT_EQ(state.momentum_buffer().scalar_type(), torch::kFloat);
  EXPECT_EQ(amp.master_params(opt).size(), params.size());
}

TEST(Initialize, O3CastsOptimizerStateToTheModelDtype) {
  auto lin = torch::nn::Linear(3, 2);
  torch::optim::Adam opt(lin->parameters());
  for (auto& p : lin->parameters()) p.mutable_grad() = torch::ones_like(p);
  opt.step();
  ampp::initialize(lin.ptr(), opt, quiet(OptLevel::O3));
  EXPECT_EQ(opt.param_groups()[0].params()[0].scalar_type(), torch::kBFloat16);
  auto& state = static_cast<torch::optim::AdamParamState&>(*opt.state().at(ampp::optimizer_state_key(lin->weight)));
  EXPECT_EQ(state.exp_avg().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(state.exp_avg_sq().scalar_type(), torch::kBFloat16);
}

TEST(Initialize, O0AndO1LeaveTheModelAlone) {
  for (const char* level : {"O0", "O1"}) {
    RefCnn net;
    torch::optim::SGD opt(net->parameters(), 0.1);
    auto before = opt.param_groups()[0].params();
    ampp::initialize(net, opt, quiet(Properties(level)));
    for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat) << level;
    const auto& after = opt.param_groups()[0].params();
    for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(after[i].is_same(before[i])) << level;
  }
}

TEST(Initialize, Fp16OnCpuIsEmulatedInFloat32Carriers) {
  RefCnn net;
  torch::manual_seed(3);
  torch::NoGradGuard no_grad;
  net->fc->weight.fill_(1.0 + 1.0 / 4096);  // between two fp16 values (spacing 2^-10 at 1.0)
  torch::optim::SGD opt(net->parameters(), 0.1);
  auto amp = ampp::initialize(net, opt, quiet(Properties("O2").dtype(torch::kHalf)));
  EXPECT_TRUE(amp.fp16_emulated());
  EXPECT_EQ(amp.model_storage_dtype(), torch::kFloat);
  EXPECT_EQ(net->fc->weight.scalar_type(), torch::kFloat);
  EXPECT_EQ(net->fc->weight[0][0].item<float>(), 1.0f);  // rounded to nearest even fp16 value
}

// ---- bad input ---------------------------------------------------------------------------------

TEST(InitializeErrors, O2WithAnOptimizerOfAnotherModel) {
  RefCnn net, other;
  torch::optim::SGD opt(other->parameters(), 0.1);
  AMPP_EXPECT_THROW_WITH(ampp::initialize(net, opt, quiet(OptLevel::O2)), "holds none of the model's parameters");
}

TEST(InitializeErrors, O2WithAForeignLowPrecisionTensor) {
  RefCnn net;
  auto foreign = torch::zeros({3}, torch::kBFloat16).requires_grad_();
  auto params = net->parameters();
  params.push_back(foreign);
  torch::optim::SGD opt(params, 0.1);
  AMPP_EXPECT_THROW_WITH(ampp::initialize(net, opt, quiet(OptLevel::O2)), "not a parameter of the model");
}

TEST(InitializeErrors, SameParameterInTwoOptimizersUnderO2) {
  RefCnn net;
  torch::optim::SGD a(net->parameters(), 0.1), b(net->fc->parameters(), 0.1);
  AMPP_EXPECT_THROW_WITH(ampp::initialize({net.ptr()}, {&a, &b}, quiet(OptLevel::O2)), "more than one optimizer");
}

TEST(InitializeErrors, SameOptimizerTwice) {
  RefCnn net;
  torch::optim::SGD a(net->parameters(), 0.1);
  AMPP_EXPECT_THROW_WITH(ampp::initialize({net.ptr()}, {&a, &a}, quiet(OptLevel::O1)), "passed twice");
}

TEST(InitializeErrors, Fp16WhereNothingCanRunIt) {
  RefCnn net;
  torch::optim::SGD opt(net->parameters(), 0.1);
  AMPP_EXPECT_THROW_WITH(ampp::initialize(net, opt, quiet(Properties("O2").dtype(torch::kHalf).emulate_fp16(false))),
                         "no fp16 kernels");
  auto meta = std::make_shared<torch::nn::Module>();
  meta->register_parameter("w", torch::empty({2}, torch::TensorOptions().device(torch::kMeta)));
  AMPP_EXPECT_THROW_WITH(ampp::initialize(meta, quiet(Properties("O1").dtype(torch::kHalf))),
                         "neither LibTorch kernels nor ampp's emulation");
  AMPP_EXPECT_THROW_WITH(ampp::initialize(meta, quiet(Properties("O2"))), "neither LibTorch kernels");
  // The check applies to the dtype actually used; O0 needs no low precision anywhere.
  EXPECT_NO_THROW(ampp::initialize(meta, quiet(Properties("O0").dtype(torch::kHalf))));
}

TEST(InitializeErrors, ModelAlreadyCast) {
  RefCnn net;
  net->to(torch::kBFloat16);
  torch::optim::SGD opt(net->parameters(), 0.1);
  AMPP_EXPECT_THROW_WITH(ampp::initialize(net, opt, quiet(OptLevel::O2)), "expects an FP32 model");
}

TEST(InitializeErrors, ScaleLossArguments) {
  RefCnn net;
  torch::optim::SGD opt(net->parameters(), 0.1), stranger(net->parameters(), 0.1);
  auto amp = ampp::initialize(net, opt, quiet(OptLevel::O1));
  AMPP_EXPECT_THROW_WITH(amp.scale_loss(torch::ones({2})), "scalar loss");
  AMPP_EXPECT_THROW_WITH(amp.scale_loss(torch::ones({}), 1), "loss_id 1 is out of range");
  AMPP_EXPECT_THROW_WITH(amp.scale_loss(torch::ones({}), ampp::ScaleLossOptions().optimizers({&stranger})),
                         "was not passed to ampp::initialize");
}

// Under O2/O3 a model called directly instead of through amp.forward: with fp16 emulated on the CPU it would
// train in float32 without a word (bf16 refuses the float32 input). The same error at scale_loss for both;
// O1 (no cast) and a forward through amp.forward pass, and an evaluation forward does not count as training.
TEST(InitializeErrors, AnO2ModelTrainedAroundAmpForwardIsNamedInFp16AsInBf16) {
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(0);
    torch::nn::Linear net(4, 3);
    torch::optim::SGD opt(net->parameters(), 0.1);
    auto amp = ampp::initialize(net, opt, quiet(OptLevel::O2).dtype(dtype));
    const auto x = torch::randn({2, 4});
    {
      torch::NoGradGuard no_grad;
      amp.forward(net, x);
    }
    if (dtype == torch::kHalf) {
      const auto direct = net->forward(x).sum();  // float32 all through: nothing refuses it
      EXPECT_EQ(direct.scalar_type(), torch::kFloat);
      AMPP_EXPECT_THROW_WITH(amp.scale_loss(direct), "no forward has gone through amp.forward()");
    }
    AMPP_EXPECT_THROW_WITH(amp.scale_loss(torch::ones({}, torch::requires_grad())),
                           "Call the model as amp.forward(model, input)");
    amp.scale_loss(amp.forward(net, x).sum()).backward();
    amp.step();
  }
  torch::nn::Linear net(4, 3);
  torch::optim::SGD opt(net->parameters(), 0.1);
  auto amp = ampp::initialize(net, opt, quiet(OptLevel::O1).dtype(torch::kHalf));
  amp.scale_loss(net->forward(torch::randn({2, 4})).sum()).backward();
}

namespace {

// As pytorch/examples' cpp/mnist declares its network: a plain module, not through TORCH_MODULE.
struct ByValueNet : torch::nn::Module {
  ByValueNet() { fc = register_module("fc", torch::nn::Linear(4, 3)); }
  torch::Tensor forward(torch::Tensor x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};

}  // namespace

// Evaluation after O2 training: amp.forward casts the input to the model's dtype (and the output back),
// given the model as a std::shared_ptr or as the module itself (a reference); called directly, the model
// refuses FP32 input. (initialize() needs the module in a shared_ptr: LibTorch's modules() does.)
TEST(Initialize, O2EvaluationGoesThroughAmpForwardForEveryWayOfHoldingTheModel) {
  torch::manual_seed(0);
  auto shared = std::make_shared<ByValueNet>();
  ByValueNet& net = *shared;
  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(0.1));
  auto amp = ampp::initialize(shared, opt, quiet(OptLevel::O2));
  const auto x = torch::randn({2, 4});
  net.eval();
  torch::NoGradGuard no_grad;
  EXPECT_THROW(net.forward(x), c10::Error);  // float input, bf16 weights
  const auto by_value = amp.forward(net, x);
  EXPECT_EQ(by_value.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(amp.forward(shared, x), by_value));
  EXPECT_TRUE(torch::equal(by_value, net.forward(x.to(torch::kBFloat16)).to(torch::kFloat)));
}
