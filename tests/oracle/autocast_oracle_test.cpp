// ampp::autocast (CPU) against torch.autocast("cpu"): for every op below, the same inputs (float32,
// the region's dtype, or mixed) run inside both regions. bf16: output dtype and bits must match
// (ampp forced to native bf16 compute, which is what PyTorch does). fp16: output dtypes only, since
// ampp emulates fp16 on CPU in float32 carriers (docs/precision.md, "fp16 on CPU (emulated)").

#include "oracle/oracle.h"

#include <ampp/precision/autocast.h>
#include <ampp/util/torch_version.h>

#include <gtest/gtest.h>
#include <torch/fft.h>

#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace {

using ampp_oracle::decode;
using ampp_oracle::dtype_name;
using ampp_oracle::encode;
using ampp_oracle::json;
using Tensors = std::vector<torch::Tensor>;

enum class Kind { normal, positive, probability, well_conditioned };

struct Input {
  std::vector<int64_t> shape;
  Kind kind = Kind::normal;
};

struct Op {
  std::string name;  // the key of OPS in autocast_oracle.py
  std::vector<Input> inputs;
  std::function<torch::Tensor(const Tensors&)> fn;
};

// Class targets / embedding indices: built identically by targets() in autocast_oracle.py.
torch::Tensor targets(int64_t n, int64_t classes) { return torch::arange(n) % classes; }

// Keep in sync with OPS in autocast_oracle.py (same names, same arguments, same defaults).
std::vector<Op> ops() {
  const Kind pos = Kind::positive, prob = Kind::probability;
  return {
      {"mm", {{{4, 6}}, {{6, 5}}}, [](const Tensors& x) { return torch::mm(x[0], x[1]); }},
      {"matmul", {{{2, 4, 6}}, {{6, 5}}}, [](const Tensors& x) { return torch::matmul(x[0], x[1]); }},
      // matmul shapes that decompose into mv and dot (not lower-precision ops themselves).
      {"matmul_mv", {{{4, 6}}, {{6}}}, [](const Tensors& x) { return torch::matmul(x[0], x[1]); }},
      {"matmul_dot", {{{6}}, {{6}}}, [](const Tensors& x) { return torch::matmul(x[0], x[1]); }},
      {"matmul_folded_mv", {{{2, 4, 6}}, {{6}}}, [](const Tensors& x) { return torch::matmul(x[0], x[1]); }},
      {"addmm", {{{4, 5}}, {{4, 6}}, {{6, 5}}}, [](const Tensors& x) { return torch::addmm(x[0], x[1], x[2]); }},
      {"bmm", {{{2, 4, 6}}, {{2, 6, 5}}}, [](const Tensors& x) { return torch::bmm(x[0], x[1]); }},
      {"baddbmm",
       {{{2, 4, 5}}, {{2, 4, 6}}, {{2, 6, 5}}},
       [](const Tensors& x) { return torch::baddbmm(x[0], x[1], x[2]); }},
      {"addbmm",
       {{{4, 5}}, {{2, 4, 6}}, {{2, 6, 5}}},
       [](const Tensors& x) { return torch::addbmm(x[0], x[1], x[2]); }},
      {"linear", {{{3, 6}}, {{5, 6}}, {{5}}}, [](const Tensors& x) { return torch::linear(x[0], x[1], x[2]); }},
      {"conv1d", {{{2, 3, 10}}, {{4, 3, 3}}, {{4}}}, [](const Tensors& x) { return torch::conv1d(x[0], x[1], x[2]); }},
      {"conv2d",
       {{{1, 3, 6, 6}}, {{4, 3, 3, 3}}, {{4}}},
       [](const Tensors& x) { return torch::conv2d(x[0], x[1], x[2], /*stride=*/1, /*padding=*/1); }},
      {"conv3d",
       {{{1, 2, 4, 4, 4}}, {{3, 2, 2, 2, 2}}, {{3}}},
       [](const Tensors& x) { return torch::conv3d(x[0], x[1], x[2]); }},
      {"conv_transpose1d",
       {{{2, 3, 8}}, {{3, 4, 3}}, {{4}}},
       [](const Tensors& x) { return torch::conv_transpose1d(x[0], x[1], x[2]); }},
      {"conv_transpose2d",
       {{{1, 3, 5, 5}}, {{3, 2, 3, 3}}, {{2}}},
       [](const Tensors& x) { return torch::conv_transpose2d(x[0], x[1], x[2]); }},
      {"prelu", {{{2, 3, 4}}, {{3}, pos}}, [](const Tensors& x) { return torch::prelu(x[0], x[1]); }},
#if AMPP_TORCH_AT_LEAST(2, 0)  // ops LibTorch 1.13 does not have
      {"scaled_dot_product_attention",
       {{{1, 2, 4, 8}}, {{1, 2, 4, 8}}, {{1, 2, 4, 8}}},
       [](const Tensors& x) { return at::scaled_dot_product_attention(x[0], x[1], x[2]); }},
      // The GPT's attention (gpt.h): causal, 8 positions, 2 heads of 16.
      {"scaled_dot_product_attention_causal",
       {{{2, 2, 8, 16}}, {{2, 2, 8, 16}}, {{2, 2, 8, 16}}},
       [](const Tensors& x) { return at::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, true); }},
      {"linalg_vecdot", {{{3, 6}}, {{3, 6}}}, [](const Tensors& x) { return at::linalg_vecdot(x[0], x[1]); }},
#endif
      {"einsum", {{{4, 6}}, {{6, 5}}}, [](const Tensors& x) { return torch::einsum("ij,jk->ik", {x[0], x[1]}); }},
      {"relu", {{{4, 8}}}, [](const Tensors& x) { return torch::relu(x[0]); }},
      {"sigmoid", {{{4, 8}}}, [](const Tensors& x) { return torch::sigmoid(x[0]); }},
      {"tanh", {{{4, 8}}}, [](const Tensors& x) { return torch::tanh(x[0]); }},
      {"gelu", {{{4, 8}}}, [](const Tensors& x) { return torch::gelu(x[0]); }},
      {"exp", {{{4, 8}}}, [](const Tensors& x) { return torch::exp(x[0]); }},
      {"log", {{{4, 8}, pos}}, [](const Tensors& x) { return torch::log(x[0]); }},
      {"sqrt", {{{4, 8}, pos}}, [](const Tensors& x) { return torch::sqrt(x[0]); }},
      {"pow", {{{4, 8}}}, [](const Tensors& x) { return torch::pow(x[0], 2); }},
      {"softmax", {{{4, 8}}}, [](const Tensors& x) { return torch::softmax(x[0], -1); }},
      {"log_softmax", {{{4, 8}}}, [](const Tensors& x) { return torch::log_softmax(x[0], -1); }},
      {"layer_norm",
       {{{3, 8}}, {{8}}, {{8}}},
       [](const Tensors& x) { return torch::layer_norm(x[0], {x[0].size(-1)}, x[1], x[2]); }},
      {"group_norm",
       {{{2, 4, 3}}, {{4}}, {{4}}},
       [](const Tensors& x) { return torch::group_norm(x[0], 2, x[1], x[2]); }},
      {"batch_norm",
       {{{4, 3}}, {{3}}, {{3}, pos}, {{3}}, {{3}}},
       [](const Tensors& x) {
         return torch::batch_norm(x[0], x[3], x[4], x[1], x[2], /*training=*/false, 0.1, 1e-5, /*cudnn_enabled=*/true);
       }},
      {"sum", {{{4, 8}}}, [](const Tensors& x) { return torch::sum(x[0]); }},
      {"mean", {{{4, 8}}}, [](const Tensors& x) { return torch::mean(x[0]); }},
      {"prod", {{{8}}}, [](const Tensors& x) { return torch::prod(x[0]); }},
      {"cumsum", {{{4, 8}}}, [](const Tensors& x) { return torch::cumsum(x[0], 0); }},
      {"add", {{{4, 8}}, {{4, 8}}}, [](const Tensors& x) { return x[0] + x[1]; }},
      {"mul", {{{4, 8}}, {{4, 8}}}, [](const Tensors& x) { return x[0] * x[1]; }},
      {"div", {{{4, 8}}, {{4, 8}, pos}}, [](const Tensors& x) { return x[0] / x[1]; }},
      {"cat", {{{3, 4}}, {{3, 4}}}, [](const Tensors& x) { return torch::cat({x[0], x[1]}); }},
      {"stack", {{{3, 4}}, {{3, 4}}}, [](const Tensors& x) { return torch::stack({x[0], x[1]}); }},
      {"mse_loss", {{{4, 8}}, {{4, 8}}}, [](const Tensors& x) { return torch::mse_loss(x[0], x[1]); }},
      {"l1_loss", {{{4, 8}}, {{4, 8}}}, [](const Tensors& x) { return torch::l1_loss(x[0], x[1]); }},
      {"smooth_l1_loss", {{{4, 8}}, {{4, 8}}}, [](const Tensors& x) { return torch::smooth_l1_loss(x[0], x[1]); }},
      {"kl_div",
       {{{4, 8}}, {{4, 8}, pos}},
       [](const Tensors& x) { return torch::kl_div(x[0], x[1], at::Reduction::Mean); }},
      {"cross_entropy",
       {{{4, 5}}},
       [](const Tensors& x) { return torch::cross_entropy_loss(x[0], targets(x[0].size(0), x[0].size(1))); }},
      // The GPT's loss: every position of 4 sequences of 8 against the byte vocabulary.
      {"cross_entropy_vocabulary",
       {{{32, 256}}},
       [](const Tensors& x) { return torch::cross_entropy_loss(x[0], targets(x[0].size(0), x[0].size(1))); }},
      {"nll_loss",
       {{{4, 5}}},
       [](const Tensors& x) { return torch::nll_loss_nd(x[0], targets(x[0].size(0), x[0].size(1))); }},
      {"binary_cross_entropy",
       {{{4, 8}, prob}, {{4, 8}, prob}},
       [](const Tensors& x) { return torch::binary_cross_entropy(x[0], x[1]); }},
      {"binary_cross_entropy_with_logits",
       {{{4, 8}}, {{4, 8}, prob}},
       [](const Tensors& x) { return torch::binary_cross_entropy_with_logits(x[0], x[1]); }},
      {"cdist", {{{3, 4}}, {{5, 4}}}, [](const Tensors& x) { return torch::cdist(x[0], x[1]); }},
      {"max_pool2d", {{{1, 2, 6, 6}}}, [](const Tensors& x) { return torch::max_pool2d(x[0], {2, 2}); }},
      {"avg_pool2d", {{{1, 2, 6, 6}}}, [](const Tensors& x) { return torch::avg_pool2d(x[0], {2, 2}); }},
      {"adaptive_avg_pool2d",
       {{{1, 2, 6, 6}}},
       [](const Tensors& x) { return torch::adaptive_avg_pool2d(x[0], {2, 2}); }},
      {"embedding", {{{6, 4}}}, [](const Tensors& x) { return torch::embedding(x[0], targets(4, x[0].size(0))); }},
      {"inverse", {{{4, 4}, Kind::well_conditioned}}, [](const Tensors& x) { return torch::inverse(x[0]); }},
      {"linalg_matrix_norm",
       {{{3, 4}}},
       [](const Tensors& x) { return at::linalg_matrix_norm(x[0], c10::string_view("fro")); }},
      {"fft_rfft", {{{8}}}, [](const Tensors& x) { return torch::fft::rfft(x[0]); }},
  };
}

// Known, deliberate differences between ampp and torch 2.13, keyed "<region>/<inputs>/<op>".
// Each entry must still differ (else remove it); everything not listed must match exactly.
const std::map<std::string, std::string>& known_differences() {
  // docs/precision.md: ampp bans binary_cross_entropy under fp16 (as CUDA autocast does: a saturated
  // sigmoid gives log(0)); torch 2.13's CPU autocast runs it in fp32.
  static const std::map<std::string, std::string> known{
      {"float16/float32/binary_cross_entropy", "ampp: banned under fp16 (raises); torch 2.13 CPU: fp32"},
  };
  return known;
}

torch::Tensor make_input(const Input& in, at::Generator& gen) {
  switch (in.kind) {
    case Kind::normal:
      return torch::randn(in.shape, gen);
    case Kind::positive:
      return torch::rand(in.shape, gen) + 0.5;
    case Kind::probability:
      return torch::rand(in.shape, gen) * 0.9 + 0.05;
    case Kind::well_conditioned:
      return torch::randn(in.shape, gen) * 0.1 + torch::eye(in.shape.at(0));
  }
  TORCH_CHECK(false, "unknown input kind");
}

struct AutocastCase {
  const Op* op;
  // "float32", the region's dtype, "mixed" (first input in the region's dtype), or one dtype per input
  // ("float16,bfloat16")
  std::string input_dtype;
  Tensors inputs;  // float32 values, before the cast to input_dtype
  std::string key(const std::string& region) const { return region + "/" + input_dtype + "/" + op->name; }
};

// Promote ops also get two different lower-precision dtypes, and the other one alone (fp16 + bf16,
// fp16 + fp16 in a bf16 region), where LibTorch's versions differ (docs/precision.md).
std::vector<std::string> dtypes_for(const Op& op, std::vector<std::string> dtypes, c10::ScalarType region,
                                    bool lower_inputs) {
  if (!lower_inputs || (op.name != "cat" && op.name != "stack")) return dtypes;
  const std::string mine = dtype_name(region), other = region == torch::kHalf ? "bfloat16" : "float16";
  dtypes.insert(dtypes.end(), {other + "," + mine, other + "," + other});
  return dtypes;
}

std::vector<AutocastCase> make_cases(const std::vector<Op>& all, c10::ScalarType region, bool lower_inputs) {
  auto gen = at::detail::createCPUGenerator(2024);
  std::vector<AutocastCase> cases;
  std::vector<std::string> input_dtypes{"float32"};
  if (lower_inputs) input_dtypes.insert(input_dtypes.end(), {dtype_name(region), "mixed"});
  for (const auto& op : all)
    for (const auto& in_dtype : dtypes_for(op, input_dtypes, region, lower_inputs)) {
      if (in_dtype == "mixed" && op.inputs.size() < 2) continue;
      AutocastCase c{&op, in_dtype, {}};
      for (const auto& in : op.inputs) c.inputs.push_back(make_input(in, gen));
      cases.push_back(std::move(c));
    }
  return cases;
}

json cases_to_json(const std::vector<AutocastCase>& cases, c10::ScalarType region) {
  json j = {{"region", dtype_name(region)}, {"cases", json::array()}};
  for (const auto& c : cases) {
    json inputs = json::array();
    for (const auto& t : c.inputs) inputs.push_back(encode(t));
    j["cases"].push_back({{"op", c.op->name}, {"input_dtype", c.input_dtype}, {"inputs", inputs}});
  }
  return j;
}

struct Outcome {
  bool ok = false;
  torch::Tensor out;
  std::string error;
};

Outcome run_ampp(const AutocastCase& c, c10::ScalarType region, ampp::Bf16Compute compute) {
  Tensors inputs;
  std::vector<std::string> per_input;  // "float16,bfloat16": one dtype per input
  if (c.input_dtype.find(',') != std::string::npos) {
    std::istringstream names(c.input_dtype);
    for (std::string name; std::getline(names, name, ',');) per_input.push_back(name);
  }
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const bool lower = c.input_dtype == dtype_name(region) || (c.input_dtype == "mixed" && i == 0);
    if (!per_input.empty())
      inputs.push_back(c.inputs[i].to(ampp_oracle::dtype_from_name(per_input.at(i))));
    else
      inputs.push_back(lower ? c.inputs[i].to(region) : c.inputs[i]);
  }
  try {
    // kNative is what PyTorch's CPU autocast does; kFp32 must give the same dtypes (ignored under fp16).
    // fp16 follows the CPU lists here, the ones torch.autocast("cpu") has; ampp's default for fp16, the
    // CUDA lists, cannot be run against torch on this CPU-only machine (fp16_cuda_lists_test.cpp).
    const auto options = ampp::AutocastOptions().bf16_compute(compute).fp16_op_lists(ampp::Fp16OpLists::kCpu);
    ampp::autocast guard(torch::kCPU, region, true, options);
    return {true, c.op->fn(inputs), ""};
  } catch (const c10::Error& e) {
    return {false, {}, e.what_without_backtrace()};
  }
}

// fp16 on CPU: ampp's lowered ops return float32 tensors holding fp16 values. Where torch returns
// float16, a float32 result whose every value is an fp16 value counts as "float16 (emulated)".
std::string effective_fp16_dtype(const torch::Tensor& out, const std::string& torch_dtype) {
  if (out.scalar_type() == torch::kFloat && torch_dtype == "float16") {
    const auto rounded = out.to(torch::kHalf).to(torch::kFloat);
    if (torch::equal(rounded.isnan(), out.isnan()) && torch::equal(rounded.nan_to_num(0), out.nan_to_num(0)))
      return "float16";
  }
  return dtype_name(out.scalar_type());
}

// Compares one case; returns "" when ampp and torch agree, else a description of the difference.
std::string difference(const AutocastCase& c, c10::ScalarType region, ampp::Bf16Compute compute, const json& oracle) {
  const Outcome mine = run_ampp(c, region, compute);
  const bool torch_ok = oracle.at("ok").get<bool>();
  if (!mine.ok || !torch_ok) {
    if (mine.ok == torch_ok) return "";  // both refuse
    return mine.ok
               ? "torch raised (" + oracle.at("error").get<std::string>() + "), ampp returned " +
                     dtype_name(mine.out.scalar_type())
               : "ampp raised (" + mine.error + "), torch returned " + oracle.at("out").at("dtype").get<std::string>();
  }
  const auto expected = decode(oracle.at("out"));
  const std::string torch_dtype = dtype_name(expected.scalar_type());
  if (region == torch::kBFloat16 && compute == ampp::Bf16Compute::kFp32) {
    // fp32 arithmetic on the stored operands: values differ within docs/precision.md's bound, dtypes may not.
    const std::string mine_dtype = dtype_name(mine.out.scalar_type());
    return mine_dtype == torch_dtype ? "" : "dtype: ampp " + mine_dtype + " torch " + torch_dtype;
  }
  if (region == torch::kHalf) {
    const std::string mine_dtype = effective_fp16_dtype(mine.out, torch_dtype);
    return mine_dtype == torch_dtype
               ? ""
               : "dtype: ampp " + mine_dtype + " (" + dtype_name(mine.out.scalar_type()) + ") torch " + torch_dtype;
  }
  const auto same = ampp_oracle::same_bits(mine.out, expected);
  return same ? "" : same.message();
}

// `label` names the configuration in known_differences() keys (the region's dtype, or "bfloat16-fp32").
void compare_region(c10::ScalarType region, bool lower_inputs, ampp::Bf16Compute compute = ampp::Bf16Compute::kNative) {
  at::set_num_threads(1);  // the oracle runs single-threaded too: same reduction order
  const auto all = ops();
  const auto cases = make_cases(all, region, lower_inputs);
  const auto answer = ampp_oracle::run("autocast_oracle.py", cases_to_json(cases, region));
  if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
  const auto& results = answer->at("results");
  ASSERT_EQ(results.size(), cases.size());

  const std::string region_name = dtype_name(region);
  const std::string label = compute == ampp::Bf16Compute::kFp32 ? region_name + "-fp32" : region_name;
  std::set<std::string> seen_known;
  int lowered = 0;  // torch outputs in the region's dtype: the region must really lower ops
  for (size_t i = 0; i < cases.size(); ++i) {
    if (results[i].at("ok").get<bool>() && results[i].at("out").at("dtype") == region_name) ++lowered;
    const std::string key = cases[i].key(label);
    const std::string diff = difference(cases[i], region, compute, results[i]);
    const auto known = known_differences().find(key);
    if (known != known_differences().end()) {
      seen_known.insert(key);
      EXPECT_NE(diff, "") << key << " is listed as a known difference (" << known->second
                          << ") but now matches torch: remove it from known_differences()";
      continue;
    }
    EXPECT_EQ(diff, "") << key;
  }
  EXPECT_GE(lowered, 15) << "too few ops ran in " << region_name << ": is the oracle's autocast region active?";
  for (const auto& [key, reason] : known_differences())
    if (key.rfind(label + "/", 0) == 0) {
      EXPECT_TRUE(seen_known.count(key)) << "known difference " << key << " names no case";
    }
}

TEST(AutocastOracle, Bf16DtypesAndBitsMatchTorchAutocastCpu) { compare_region(torch::kBFloat16, true); }

TEST(AutocastOracle, Fp16DtypesMatchTorchAutocastCpu) { compare_region(torch::kHalf, false); }

// Bf16Compute::kFp32 (chosen automatically on CPUs without bf16 units): only values may differ.
TEST(AutocastOracle, Bf16Fp32ComputeDtypesMatchTorchAutocastCpu) {
  compare_region(torch::kBFloat16, true, ampp::Bf16Compute::kFp32);
}

}  // namespace
