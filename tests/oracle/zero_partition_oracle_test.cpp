// ampp::dist::assign_parameters_to_ranks against PyTorch's ZeroRedundancyOptimizer partition: the
// owner of every parameter for random group layouts (ties in size included) and world sizes 1-5.

#include "oracle/oracle.h"

#include <ampp/dist/zero_redundancy_optimizer.h>

#include <gtest/gtest.h>

namespace {

using ampp_oracle::json;

// Parameter sizes per group: few distinct sizes, so ties (where order decides) are common.
std::vector<std::vector<int64_t>> random_groups(ampp_oracle::Rng& rng) {
  std::vector<std::vector<int64_t>> groups(static_cast<size_t>(rng.integer(1, 3)));
  for (auto& g : groups) {
    g.resize(static_cast<size_t>(rng.integer(1, 9)));
    for (auto& n : g) n = int64_t{1} << rng.integer(0, 6);
  }
  return groups;
}

std::vector<torch::optim::OptimizerParamGroup> to_param_groups(const std::vector<std::vector<int64_t>>& sizes) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& g : sizes) {
    std::vector<torch::Tensor> params;
    for (auto n : g) params.push_back(torch::zeros({n}));
    groups.emplace_back(params);
  }
  return groups;
}

TEST(ZeroPartitionOracle, OwnersMatchPyTorchsSortedGreedyPartition) {
  ampp_oracle::Rng rng(7);
  std::vector<std::vector<std::vector<int64_t>>> layouts;
  std::vector<int> worlds;
  json input = {{"cases", json::array()}};
  for (int i = 0; i < 200; ++i) {
    layouts.push_back(random_groups(rng));
    worlds.push_back(static_cast<int>(rng.integer(1, 5)));
    input["cases"].push_back({{"groups", layouts.back()}, {"world", worlds.back()}});
  }
  const auto answer = ampp_oracle::run("zero_partition_oracle.py", input);
  if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
  const auto& owners = answer->at("owners");
  ASSERT_EQ(owners.size(), layouts.size());
  int spread = 0;  // cases where more than one rank owns something: the greedy choice was exercised
  for (size_t i = 0; i < layouts.size(); ++i) {
    const auto ours = ampp::dist::assign_parameters_to_ranks(to_param_groups(layouts[i]), worlds[i]);
    EXPECT_EQ(ours, owners[i].get<std::vector<int>>()) << "case " << i << ": " << input["cases"][i].dump();
    spread += std::any_of(ours.begin(), ours.end(), [](int r) { return r > 0; }) ? 1 : 0;
  }
  EXPECT_GT(spread, 100);
}

}  // namespace
