// ampp::dist::FullyShardedDataParallel against PyTorch's FSDP2 (fully_shard) on 2 Gloo ranks: the same
// residual stack (tests/dist/fsdp_test_util.h) from the same weights on the same batches, with SGD and
// momentum. Every rank's losses, its shard of every gradient after the first backward (which rows it
// holds, and their bits) and the full parameters after the last step must be bit-identical, in FP32 and
// with bf16 parameters (reduced in bf16, or in FP32).

#include "oracle/oracle.h"

#include "dist/fsdp_test_util.h"
#include "dist/multiprocess.h"

#include <gtest/gtest.h>

namespace {

using ampp_oracle::json;
using namespace ampp::dist;

struct Case {
  std::optional<c10::ScalarType> param_dtype, reduce_dtype;
};

json case_json(const Case& c, const json& weights, const json& batches) {
  json j = {{"weights", weights}, {"batches", batches}, {"lr", 0.05}};
  if (c.param_dtype) j["param_dtype"] = ampp_oracle::dtype_name(*c.param_dtype);
  if (c.reduce_dtype) j["reduce_dtype"] = ampp_oracle::dtype_name(*c.reduce_dtype);
  return j;
}

// Trains one case on this rank and compares it with rank `rank`'s answer from Python.
void check_case(const Case& c, const json& input, const json& answer, int rank, const ProcessGroup& pg) {
  auto model = ampp_test::make_stack(1);
  auto policy =
      MixedPrecisionPolicy().param_dtype(c.param_dtype).reduce_dtype(c.reduce_dtype).output_dtype(torch::kFloat);
  FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg).mp_policy(policy));
  torch::optim::SGD opt(fsdp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const auto& batches = input["batches"];
  for (size_t step = 0; step < batches.size(); ++step) {
    const auto x = ampp_oracle::decode(batches[step]["x"][rank]), y = ampp_oracle::decode(batches[step]["y"][rank]);
    opt.zero_grad();
    auto loss = torch::mse_loss(fsdp.forward<ampp_test::StackImpl>(x), y);
    loss.backward();
    if (step == 0)
      for (const auto& [name, shard] : fsdp.named_parameters())
        EXPECT_TRUE(ampp_oracle::same_bits(shard.grad(), ampp_oracle::decode(answer["first_grads"][name])))
            << "rank " << rank << ": the gradient shard of " << name;
    opt.step();
    EXPECT_TRUE(ampp_oracle::same_bits(loss.detach(), ampp_oracle::decode(answer["losses"][step])))
        << "rank " << rank << ", step " << step;
  }
  const auto full = fsdp.full_state_dict();
  for (const auto& p : model->named_parameters())
    EXPECT_TRUE(ampp_oracle::same_bits(full.at(p.key()).toTensor(), ampp_oracle::decode(answer["full"][p.key()])))
        << "rank " << rank << ": " << p.key() << " after the last step";
}

TEST(FsdpOracle, TrainingMatchesFsdp2BitForBitInFp32AndBf16) {
  const std::vector<Case> cases{
      {std::nullopt, std::nullopt}, {torch::kBFloat16, std::nullopt}, {torch::kBFloat16, torch::kFloat}};
  json weights;
  for (const auto& p : ampp_test::make_stack(1)->named_parameters()) weights[p.key()] = ampp_oracle::encode(p.value());
  json batches = json::array();
  for (uint64_t step = 0; step < 4; ++step) {
    const auto t = ampp_oracle::randn_tensors({{4, 8}, {4, 5}, {4, 8}, {4, 5}}, 300 + step);
    batches.push_back({{"x", {ampp_oracle::encode(t[0]), ampp_oracle::encode(t[2])}},
                       {"y", {ampp_oracle::encode(t[1]), ampp_oracle::encode(t[3])}}});
  }
  json input = {{"world", 2}, {"cases", json::array()}};
  for (const auto& c : cases) input["cases"].push_back(case_json(c, weights, batches));
  const auto answer = ampp_oracle::run("fsdp_oracle.py", input);
  if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
  ampp_test::on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("case " + std::to_string(i));
      check_case(cases[i], input["cases"][i], answer->at("cases")[i][rank], rank, pg);
    }
  });
}

}  // namespace
