// ampp::Float8Linear and convert_to_float8_training: a Linear until converted (torch::nn::Linear's draws and
// values), fp8 products after; torchao's auto filter's shapes; the scale's edge values; clear errors. The
// products themselves are checked against torchao by the oracle suite (Float8Oracle).
#include <ampp/precision/float8_linear.h>
#include <ampp/util/torch_version.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace float8_linear_test {

#define AMPP_REQUIRE_FLOAT8() \
  if (!AMPP_TORCH_AT_LEAST(2, 6)) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer"

struct Net : torch::nn::Module {
  Net() {
    small = register_module("small", ampp::Float8Linear(128, 128));  // K <= 4096, N <= 1024: skipped
    wide = register_module("wide", ampp::Float8Linear(16, 2048));    // N > 1024: tensorwise pays
    odd = register_module("odd", ampp::Float8Linear(24, 2048));      // 24 is not a multiple of 16
    head = register_module("head", ampp::Float8Linear(2064, 4112));  // rowwise's shape too
  }
  ampp::Float8Linear small{nullptr}, wide{nullptr}, odd{nullptr}, head{nullptr};
};

std::string failure_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace float8_linear_test

using namespace float8_linear_test;

TEST(Float8Linear, BeforeConversionItIsTorchsLinearDrawForDraw) {
  torch::manual_seed(3);
  torch::nn::Linear plain(24, 40);
  torch::manual_seed(3);
  ampp::Float8Linear ours(24, 40);
  EXPECT_TRUE(torch::equal(plain->weight, ours->weight));
  EXPECT_TRUE(torch::equal(plain->bias, ours->bias));
  const auto x = torch::randn({5, 24});
  EXPECT_TRUE(torch::equal(plain(x), ours(x)));
  std::vector<std::string> names;
  for (const auto& p : ours->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
}

TEST(Float8Linear, ConvertedItRunsTheRecipesProducts) {
  AMPP_REQUIRE_FLOAT8();
  ampp::Float8Linear layer(32, 64);
  const auto x = torch::randn({16, 32});
  const auto plain = layer(x);
  const auto rowwise = ampp::Float8LinearConfig::from_recipe_name("rowwise");
  EXPECT_EQ(ampp::convert_to_float8_training(*layer, rowwise), std::vector<std::string>{""});
  const auto fp8 = layer(x);
  EXPECT_TRUE(torch::equal(fp8, ampp::float8_linear(x, layer->weight, layer->bias, rowwise)));
  EXPECT_FALSE(torch::equal(fp8, plain));  // fp8 rounding shows
  EXPECT_LT((fp8 - plain).abs().max().item<double>(), 0.1 * plain.abs().max().item<double>());
  layer->set_float8(std::nullopt);
  EXPECT_TRUE(torch::equal(layer(x), plain));
}

TEST(Float8Linear, TheAutoFilterKeepsTorchaosShapesAndSkipsByName) {
  Net net;
  auto converted = [&](ampp::Float8Recipe recipe, std::vector<std::string> skip) {
    for (auto* l : {&net.small, &net.wide, &net.odd, &net.head}) (*l)->set_float8(std::nullopt);
    return ampp::convert_to_float8_training(net, ampp::Float8LinearConfig().recipe(recipe),
                                            ampp::auto_filter_for_recipe(recipe, std::move(skip)));
  };
  EXPECT_EQ(converted(ampp::Float8Recipe::kTensorwise, {}), (std::vector<std::string>{"wide", "head"}));
  EXPECT_EQ(converted(ampp::Float8Recipe::kRowwise, {}), std::vector<std::string>{"head"});
  EXPECT_EQ(converted(ampp::Float8Recipe::kTensorwise, {"hea"}), std::vector<std::string>{"wide"});
  EXPECT_FALSE(net.small->float8().has_value());
  EXPECT_TRUE(net.wide->float8().has_value());
}

TEST(Float8Linear, ATorchLinearTheFilterTakesIsNamedNotSkipped) {
  torch::nn::Sequential seq(ampp::Float8Linear(16, 16), torch::nn::Linear(16, 16));
  const auto message = failure_of([&] { ampp::convert_to_float8_training(*seq); });
  EXPECT_NE(message.find("'1' is a torch::nn::Linear, which cannot be swapped"), std::string::npos) << message;
  EXPECT_NE(message.find("build it as ampp::Float8Linear"), std::string::npos) << message;
  const auto only_ours = [](const torch::nn::Module& m, const std::string&) {
    return m.as<ampp::Float8LinearImpl>() != nullptr;
  };
  EXPECT_EQ(ampp::convert_to_float8_training(*seq, {}, only_ours), std::vector<std::string>{"0"});
}

TEST(Float8Linear, ScalesAtTheEdges) {
  AMPP_REQUIRE_FLOAT8();
  // An all-zero tensor: amax floored at 1e-12, so a finite scale (448 / 1e-12 in float32).
  const auto zero = ampp::float8_scale(torch::zeros({4}), torch::kFloat8_e4m3fn, std::nullopt, false);
  EXPECT_EQ(zero.item<float>(), static_cast<float>(448.0 / 1e-12));
  // Rowwise: one power of two per row, the row's amax times it within the float8 range.
  const auto t = torch::randn({6, 10}) * torch::arange(1, 7).reshape({6, 1});
  const auto s = ampp::float8_scale(t, torch::kFloat8_e4m3fn, 1, true);
  EXPECT_EQ(s.sizes(), (std::vector<int64_t>{6, 1}));
  EXPECT_TRUE(torch::equal(s, torch::exp2(torch::round(torch::log2(s)))));
  EXPECT_TRUE((t.abs().amax(1, true) * s <= 448).all().item<bool>());
  EXPECT_TRUE((t.abs().amax(1, true) * s * 2 > 448).all().item<bool>());
  // The cast saturates instead of overflowing to NaN.
  const auto big = ampp::to_float8(torch::tensor({1e6F, -1e6F}), torch::ones({}), torch::kFloat8_e4m3fn);
  EXPECT_TRUE(torch::equal(big.to(torch::kFloat), torch::tensor({448.0F, -448.0F})));
}

TEST(Float8Linear, BadInputsAreClearErrors) {
  EXPECT_NE(failure_of([] {
              ampp::Float8LinearConfig::from_recipe_name("mxfp8");
            }).find("unknown fp8 recipe 'mxfp8': use tensorwise, rowwise or delayed"),
            std::string::npos);
  AMPP_REQUIRE_FLOAT8();
  const auto message =
      failure_of([] { ampp::float8_linear(torch::randn({4, 8}), torch::randn({16, 9}), torch::Tensor(), {}); });
  EXPECT_NE(message.find("x [..., K] and weight [N, K], got x [4, 8] and weight [16, 9]"), std::string::npos)
      << message;
  EXPECT_NE(failure_of([] { ampp::float8_max(torch::kFloat); }).find("the float8 types are"), std::string::npos);
}
