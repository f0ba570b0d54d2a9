// ampp::dist::DistributedSampler against torch.utils.data.DistributedSampler: the exact index list
// and len() of every rank over a grid of dataset sizes, world sizes, seeds, epochs and flags, plus
// the ranks PyTorch rejects. One Python run answers the whole grid.

#include "oracle/oracle.h"

#include <ampp/dist/sampler.h>

#include <gtest/gtest.h>

namespace {

using ampp_oracle::json;

struct SamplerCase {
  size_t n;
  int64_t world, rank;
  uint64_t seed;
  int64_t epoch;
  bool shuffle, drop_last;
};

std::string describe(const SamplerCase& c) {
  std::ostringstream os;
  os << "N=" << c.n << " world=" << c.world << " rank=" << c.rank << " seed=" << c.seed << " epoch=" << c.epoch
     << " shuffle=" << c.shuffle << " drop_last=" << c.drop_last;
  return os.str();
}

// The grid, plus rank == world for each world (PyTorch raises ValueError: ampp must reject it too).
std::vector<SamplerCase> grid() {
  std::vector<SamplerCase> cases;
  for (size_t n : {0, 1, 7, 10, 33, 100})
    for (int64_t world : {1, 2, 3, 4})
      for (int64_t rank = 0; rank <= world; ++rank)
        for (uint64_t seed : {0, 1234})
          for (int64_t epoch : {0, 1, 5})
            for (bool shuffle : {false, true})
              for (bool drop_last : {false, true}) cases.push_back({n, world, rank, seed, epoch, shuffle, drop_last});
  return cases;
}

json to_json(const SamplerCase& c) {
  return {{"n", c.n},         {"world", c.world},     {"rank", c.rank},          {"seed", c.seed},
          {"epoch", c.epoch}, {"shuffle", c.shuffle}, {"drop_last", c.drop_last}};
}

ampp::dist::DistributedSampler make(const SamplerCase& c) {
  ampp::dist::DistributedSampler s(c.n, ampp::dist::DistributedSamplerOptions()
                                            .num_replicas(c.world)
                                            .rank(c.rank)
                                            .seed(c.seed)
                                            .shuffle(c.shuffle)
                                            .drop_last(c.drop_last));
  s.set_epoch(c.epoch);
  return s;
}

// What a DataLoader sees: reset() for the epoch, then next() batches until exhausted.
std::vector<size_t> drain(ampp::dist::DistributedSampler& s, size_t batch) {
  s.reset();
  std::vector<size_t> out;
  while (auto b = s.next(batch)) out.insert(out.end(), b->begin(), b->end());
  return out;
}

TEST(SamplerOracle, IndexListsMatchPyTorchOverTheGrid) {
  const auto cases = grid();
  json input = {{"cases", json::array()}};
  for (const auto& c : cases) input["cases"].push_back(to_json(c));
  const auto answer = ampp_oracle::run("sampler_oracle.py", input);
  if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
  const auto& results = answer->at("results");
  ASSERT_EQ(results.size(), cases.size());

  size_t compared = 0, rejected = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(describe(cases[i]));
    const auto& r = results[i];
    if (!r.at("ok").get<bool>()) {
      // PyTorch rejects this configuration (rank out of range): so must ampp.
      EXPECT_THROW(make(cases[i]), c10::Error) << "torch: " << r.at("error").get<std::string>();
      ++rejected;
      continue;
    }
    auto s = make(cases[i]);
    const auto expected = r.at("indices").get<std::vector<size_t>>();
    EXPECT_EQ(s.size(), r.at("len").get<size_t>());
    EXPECT_EQ(s.indices(), expected);
    EXPECT_EQ(drain(s, 3), expected) << "reset()/next(3) batches";
    ++compared;
  }
  // The grid must really exercise both branches (guards against an oracle that rejects everything).
  EXPECT_EQ(rejected, 6u * 4 * 2 * 3 * 2 * 2);
  EXPECT_EQ(compared, cases.size() - rejected);
}

}  // namespace
