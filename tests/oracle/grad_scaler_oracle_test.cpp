// ampp::GradScaler against torch.amp.GradScaler("cpu"): whole trajectories (scale, skip decisions,
// growth tracker, scaled and unscaled gradient bits, parameter bits after plain SGD) for several
// option sets, with inf / -inf / NaN injected into the gradients at random steps and positions.

#include "oracle/oracle.h"

#include <ampp/scaling/grad_scaler.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace {

using ampp_oracle::bits_double;
using ampp_oracle::decode;
using ampp_oracle::double_bits;
using ampp_oracle::encode;
using ampp_oracle::json;
using ampp_oracle::same_bits;

constexpr int kSteps = 40;
constexpr double kLr = 0.1;
const std::vector<std::vector<int64_t>> kParamShapes{{5}, {3, 4}, {2}};

struct OptionSet {
  std::string name;
  double init_scale, growth_factor, backoff_factor;
  int64_t growth_interval;
  int grad_exponent_lo, grad_exponent_hi;  // gradients are randn * 10^k, k uniform in [lo, hi]
  double p_inject;                         // chance that a step gets non-finite gradient entries
  // Non-empty: a documented divergence from torch 2.13 that this set must reach (see compare_set).
  std::string known_difference = "";
};

std::vector<OptionSet> option_sets() {
  return {
      {"pytorch defaults, growth_interval 3", 65536.0, 2.0, 0.5, 3, -3, 3, 0.2},
      // Factors that are not powers of two: scale * factor rounds, 1/scale is inexact.
      {"odd factors", 1000.0, 1.7, 0.3, 2, -3, 3, 0.2},
      // scale * g overflows float32 by itself whenever |g| > 256.
      {"huge scale overflows by itself", std::ldexp(1.0, 120), 2.0, 0.5, 1, -3, 3, 0.1},
      // Growth would take the scale past float32's max (2^128 -> inf): 2.1+ keeps 2^127, and so does
      // ampp built against it (numerics/torch_compat.h). An oracle of another version is skipped.
      {"growth toward float max", std::ldexp(1.0, 121), 2.0, 0.5, 1, -6, -4, 0.05},
      // Repeated backoff toward subnormal scales and 0, where torch's 1/scale overflows and 0 * inf =
      // NaN reaches its weights; ampp's scale stops at 2^-126 (kMinLossScale).
      {"backoff toward zero", 1e-30, 10.0, 0.01, 2, -3, 3, 0.4, "floor"},
  };
}

struct Step {
  std::vector<torch::Tensor> grads;  // the true gradients g (before scaling)
  bool unscale;                      // call unscale_ explicitly before step
};

// Random per-step gradients with non-finite entries injected; generated once, shipped to Python.
std::vector<Step> make_steps(const OptionSet& o, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  ampp_oracle::Rng rng(seed);
  const float bad[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN()};
  std::vector<Step> steps;
  for (int s = 0; s < kSteps; ++s) {
    Step step;
    for (const auto& shape : kParamShapes) {
      const double magnitude = std::pow(10.0, static_cast<double>(rng.integer(o.grad_exponent_lo, o.grad_exponent_hi)));
      step.grads.push_back(torch::randn(shape, gen) * magnitude);
    }
    if (rng.chance(o.p_inject)) {
      for (int64_t k = rng.integer(1, 2); k > 0; --k) {
        auto& g = step.grads[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(kParamShapes.size()) - 1))];
        g.view(-1)[rng.integer(0, g.numel() - 1)] = bad[rng.integer(0, 2)];
      }
    }
    step.unscale = rng.chance(0.5);
    steps.push_back(std::move(step));
  }
  return steps;
}

json set_to_json(const OptionSet& o, const std::vector<torch::Tensor>& params, const std::vector<Step>& steps) {
  json j = {{"name", o.name},
            {"lr", double_bits(kLr)},
            {"init_scale", double_bits(o.init_scale)},
            {"growth_factor", double_bits(o.growth_factor)},
            {"backoff_factor", double_bits(o.backoff_factor)},
            {"growth_interval", o.growth_interval},
            {"params", json::array()},
            {"steps", json::array()}};
  for (const auto& p : params) j["params"].push_back(encode(p));
  for (const auto& s : steps) {
    json step = {{"unscale", s.unscale}, {"grads", json::array()}};
    for (const auto& g : s.grads) step["grads"].push_back(encode(g));
    j["steps"].push_back(step);
  }
  return j;
}

int failures_so_far() { return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count(); }

void expect_grads(const std::vector<torch::Tensor>& params, const json& expected, const char* what) {
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(same_bits(params[i].grad(), decode(expected.at(i)))) << what << " of parameter " << i;
}

// After torch's scale left float32's normal range: ampp goes on from 2^-126 (stopping with its error
// when an overflow finds the scale there) and no weight of its is ever non-finite, where torch's are.
void finish_at_the_floor(ampp::GradScaler& scaler, torch::optim::SGD& opt, std::vector<torch::Tensor>& params,
                         const std::vector<Step>& steps, size_t first, const json& oracle) {
  bool stopped = false;
  for (size_t s = first; s < steps.size() && !stopped; ++s) {
    opt.zero_grad();
    auto loss = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i] * steps[s].grads[i]).sum();
    scaler.scale(loss).backward();
    scaler.step(opt);
    try {
      scaler.update();
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("2^-126"), std::string::npos) << e.what();
      stopped = true;
    }
  }
  for (const auto& p : params) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  bool torch_non_finite = false;
  for (const auto& p : oracle.at("steps").back().at("params"))
    torch_non_finite |= !torch::isfinite(decode(p)).all().item<bool>();
  EXPECT_TRUE(torch_non_finite) << "torch's weights stayed finite: the case no longer shows what the floor prevents";
}

// One option set: ampp's trajectory compared with the oracle's after every step; stops at the first
// diverging step (everything after it would differ too). Returns true if the set's known difference
// (ampp's scale +inf where torch's is finite) was reached; the steps before it must match exactly.
bool compare_set(const OptionSet& o, const std::vector<torch::Tensor>& init, const std::vector<Step>& steps,
                 const json& oracle) {
  std::vector<torch::Tensor> params;
  for (const auto& p : init) params.push_back(p.clone().requires_grad_());
  torch::optim::SGD opt(params, torch::optim::SGDOptions(kLr));
  ampp::GradScaler scaler(ampp::GradScalerOptions()
                              .init_scale(o.init_scale)
                              .growth_factor(o.growth_factor)
                              .backoff_factor(o.backoff_factor)
                              .growth_interval(o.growth_interval));
  for (size_t s = 0; s < steps.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s) + (steps[s].unscale ? " (explicit unscale_)" : ""));
    const auto& want = oracle.at("steps").at(s);
    const int failures_before = failures_so_far();

    opt.zero_grad();
    auto loss = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i] * steps[s].grads[i]).sum();
    scaler.scale(loss).backward();
    expect_grads(params, want.at("scaled_grads"), "scaled gradient");
    if (steps[s].unscale) scaler.unscale_(opt);
    const bool stepped = scaler.step(opt);
    EXPECT_EQ(!stepped, want.at("skipped").get<bool>()) << "skip decision";
    EXPECT_EQ(scaler.found_inf_last_step(), want.at("skipped").get<bool>());
    expect_grads(params, want.at("unscaled_grads"), "unscaled gradient");
    scaler.update();

    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(same_bits(params[i].detach(), decode(want.at("params").at(i)))) << "parameter " << i;
    const double torch_scale = bits_double(want.at("get_scale").get<uint64_t>());
    if (!o.known_difference.empty() && std::isinf(scaler.get_scale()) && !std::isinf(torch_scale)) return true;
    if (o.known_difference == "floor" && torch_scale < ampp::kMinLossScale) {
      EXPECT_EQ(scaler.get_scale(), ampp::kMinLossScale);
      finish_at_the_floor(scaler, opt, params, steps, s + 1, oracle);
      return true;
    }
    EXPECT_TRUE(same_bits(scaler.scale_tensor(), decode(want.at("scale_tensor")))) << "scale tensor";
    EXPECT_EQ(double_bits(scaler.get_scale()), want.at("get_scale").get<uint64_t>())
        << "get_scale(): ampp " << scaler.get_scale() << ", torch "
        << bits_double(want.at("get_scale").get<uint64_t>());
    EXPECT_EQ(scaler.get_growth_tracker(), want.at("growth_tracker").get<int64_t>()) << "growth tracker";
    if (failures_so_far() != failures_before) return false;
  }

  // state_dict: every key PyTorch writes, with its type (float -> double, int -> int) and value.
  const auto state = scaler.state_dict();
  for (const auto& [key, value] : oracle.at("state_dict").items()) {
    SCOPED_TRACE("state_dict[\"" + key + "\"]");
    auto it = state.find(key);
    EXPECT_NE(it, state.end()) << "missing in ampp's state_dict";
    if (it == state.end()) continue;
    const std::string type = oracle.at("state_dict_types").at(key).get<std::string>();
    if (type == "float") {
      EXPECT_TRUE(it->value().isDouble()) << "ampp's is " << it->value().tagKind();
      if (it->value().isDouble()) {
        EXPECT_EQ(double_bits(it->value().toDouble()), value.get<uint64_t>())
            << "ampp " << it->value().toDouble() << ", torch " << bits_double(value.get<uint64_t>());
      }
    } else {
      EXPECT_TRUE(it->value().isInt()) << "ampp's is " << it->value().tagKind();
      if (it->value().isInt()) {
        EXPECT_EQ(it->value().toInt(), value.get<int64_t>());
      }
    }
  }
  return false;
}

TEST(GradScalerOracle, TrajectoriesMatchTorchAmpGradScaler) {
  const auto sets = option_sets();
  std::vector<std::vector<torch::Tensor>> params;
  std::vector<std::vector<Step>> steps;
  json input = {{"sets", json::array()}};
  for (size_t k = 0; k < sets.size(); ++k) {
    params.push_back(ampp_oracle::randn_tensors(kParamShapes, 100 + k));
    steps.push_back(make_steps(sets[k], 200 + k));
    input["sets"].push_back(set_to_json(sets[k], params[k], steps[k]));
  }
  const auto answer = ampp_oracle::run("grad_scaler_oracle.py", input);
  if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
  ASSERT_EQ(answer->at("sets").size(), sets.size());

  int skipped_steps = 0;
  for (size_t k = 0; k < sets.size(); ++k) {
    SCOPED_TRACE("option set '" + sets[k].name + "'");
    const bool known_reached = compare_set(sets[k], params[k], steps[k], answer->at("sets").at(k));
    if (!sets[k].known_difference.empty()) {
      EXPECT_TRUE(known_reached) << "known difference '" << sets[k].known_difference
                                 << "' no longer occurs: remove it from option_sets()";
    }
    for (const auto& s : answer->at("sets").at(k).at("steps")) skipped_steps += s.at("skipped").get<bool>();
  }
  // The cases must exercise both skipped and applied steps.
  EXPECT_GT(skipped_steps, 10);
  EXPECT_LT(skipped_steps, static_cast<int>(sets.size()) * kSteps - 10);
}

// scale() of fp16/bf16 outputs: ampp returns float32 (docs/grad_scaler.md), which must be bit for bit
// what torch computes on the output widened to float32, in the shape torch's own scale() gives.
TEST(GradScalerOracle, ScaleOfLowPrecisionOutputs) {
  const std::vector<torch::Tensor> outputs{
      torch::full({3}, 1.5, torch::kHalf),  // the case: torch 2.x gives Half inf
      torch::tensor(3.0, torch::kBFloat16),
      torch::tensor(0.7, torch::kHalf),
      torch::randn({2, 3}, at::detail::createCPUGenerator(5)).to(torch::kBFloat16),
      torch::randn({4}, at::detail::createCPUGenerator(6)),  // float32: unchanged behaviour
  };
  const double init_scale = 65536.0;
  json input = {{"scale_cases", json::array()}};
  for (const auto& o : outputs)
    input["scale_cases"].push_back({{"output", encode(o)}, {"init_scale", double_bits(init_scale)}});
  const auto answer = ampp_oracle::run("grad_scaler_oracle.py", input);
  if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
  for (size_t i = 0; i < outputs.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i) + " (" + ampp_oracle::dtype_name(outputs[i].scalar_type()) + ")");
    ampp::GradScaler scaler(ampp::GradScalerOptions().init_scale(init_scale));
    const auto scaled = scaler.scale(outputs[i]);
    const auto& want = answer->at("scale_cases").at(i);
    EXPECT_TRUE(same_bits(scaled, decode(want.at("float32"))));
    EXPECT_EQ(scaled.sizes(), decode(want.at("native")).sizes());
  }
  // The flaw ampp avoids is still torch's: if this fails, torch changed and docs/grad_scaler.md must too.
  const auto native = decode(answer->at("scale_cases").at(0).at("native"));
  EXPECT_EQ(native.scalar_type(), torch::kHalf);
  EXPECT_TRUE(torch::isinf(native).all().item<bool>());
}

}  // namespace
