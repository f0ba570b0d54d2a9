// DistributedSampler against index lists derived by hand from PyTorch's algorithm.
#include <gtest/gtest.h>

#include <set>

#include <torch/torch.h>

#include <ampp/dist/sampler.h>

using ampp::dist::DistributedSampler;
using ampp::dist::DistributedSamplerOptions;
using V = std::vector<size_t>;

namespace {
DistributedSampler make(size_t n, int64_t world, int64_t rank, bool shuffle = true, bool drop_last = false,
                        uint64_t seed = 0) {
  return DistributedSampler(
      n, DistributedSamplerOptions().num_replicas(world).rank(rank).shuffle(shuffle).drop_last(drop_last).seed(seed));
}
}  // namespace

// torch.randperm(10, generator=torch.Generator().manual_seed(0)) in PyTorch 1.13 (reference 6.1).
TEST(DistributedSampler, RandpermMatchesPyTorchForSeed0) {
  auto perm = torch::randperm(10, at::detail::createCPUGenerator(0), torch::kLong);
  const std::vector<int64_t> expected{4, 1, 7, 5, 3, 9, 0, 8, 6, 2};
  ASSERT_EQ(perm.numel(), 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(perm[i].item<int64_t>(), expected[i]) << "position " << i;
}

// N=10, R=3: num_samples = ceil(10/3) = 4, total 12. Permutation P = [4,1,7,5,3,9,0,8,6,2] padded
// with its first 2 entries -> [4,1,7,5,3,9,0,8,6,2,4,1]; rank r takes positions r, r+3, r+6, r+9.
TEST(DistributedSampler, ShuffledPaddedStride) {
  EXPECT_EQ(make(10, 3, 0).indices(), (V{4, 5, 0, 2}));
  EXPECT_EQ(make(10, 3, 1).indices(), (V{1, 3, 8, 4}));
  EXPECT_EQ(make(10, 3, 2).indices(), (V{7, 9, 6, 1}));
  EXPECT_EQ(make(10, 3, 0).size(), 4u);
}

// Epoch 1 uses seed 0 + 1 (PyTorch: randperm(10) seeded 1 -> [5,6,1,2,0,8,9,3,7,4]).
TEST(DistributedSampler, SetEpochReseeds) {
  auto s0 = make(10, 3, 0), s1 = make(10, 3, 1), s2 = make(10, 3, 2);
  for (auto* s : {&s0, &s1, &s2}) s->set_epoch(1);
  EXPECT_EQ(s0.indices(), (V{5, 2, 9, 4}));
  EXPECT_EQ(s1.indices(), (V{6, 0, 3, 5}));
  EXPECT_EQ(s2.indices(), (V{1, 8, 7, 6}));
  // Same (seed + epoch) -> same order: seed 1 epoch 0 equals seed 0 epoch 1.
  EXPECT_EQ(make(10, 3, 0, true, false, /*seed=*/1).indices(), (V{5, 2, 9, 4}));
}

// drop_last: num_samples = floor(10/3) = 3, total 9: P truncated to [4,1,7,5,3,9,0,8,6].
TEST(DistributedSampler, DropLastTruncates) {
  EXPECT_EQ(make(10, 3, 0, true, true).indices(), (V{4, 5, 0}));
  EXPECT_EQ(make(10, 3, 1, true, true).indices(), (V{1, 3, 8}));
  EXPECT_EQ(make(10, 3, 2, true, true).indices(), (V{7, 9, 6}));
}

// No shuffle, N=5, R=2: [0,1,2,3,4] + [0] -> rank 0 [0,2,4], rank 1 [1,3,0]; drop_last -> [0,2], [1,3].
TEST(DistributedSampler, SequentialPadAndDrop) {
  EXPECT_EQ(make(5, 2, 0, false).indices(), (V{0, 2, 4}));
  EXPECT_EQ(make(5, 2, 1, false).indices(), (V{1, 3, 0}));
  EXPECT_EQ(make(5, 2, 0, false, true).indices(), (V{0, 2}));
  EXPECT_EQ(make(5, 2, 1, false, true).indices(), (V{1, 3}));
}

// Padding longer than the dataset repeats the whole list: N=2, R=5 -> [0,1] -> [0,1,0,1,0].
TEST(DistributedSampler, PaddingRepeatsWholeList) {
  const V expected{0, 1, 0, 1, 0};
  for (int r = 0; r < 5; ++r) EXPECT_EQ(make(2, 5, r, false).indices(), (V{expected[r]})) << "rank " << r;
}

TEST(DistributedSampler, RanksCoverDatasetDisjointlyWhenDivisible) {
  std::multiset<size_t> all;
  for (int r = 0; r < 4; ++r)
    for (auto i : make(100, 4, r).indices()) all.insert(i);
  ASSERT_EQ(all.size(), 100u);
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(all.count(i), 1u);
}

TEST(DistributedSampler, SamplerInterfaceBatchesAndReset) {
  auto s = make(10, 3, 0);
  EXPECT_EQ(*s.next(3), (V{4, 5, 0}));
  EXPECT_EQ(*s.next(3), (V{2}));
  EXPECT_FALSE(s.next(3).has_value());
  s.set_epoch(1);
  s.reset();
  EXPECT_EQ(*s.next(10), (V{5, 2, 9, 4}));
}

// Before: make_data_loader keeps its own copy of the sampler, set_epoch() on the caller's never reached
// it, and every epoch came in the same order (issue 31). As in Python, the loader now follows it.
TEST(DistributedSampler, SetEpochReachesTheDataLoadersCopy) {
  auto sampler = make(16, 2, 0);
  auto loader = torch::data::make_data_loader(torch::data::datasets::TensorDataset(torch::arange(16)), sampler,
                                              torch::data::DataLoaderOptions().batch_size(16));
  std::set<V> orders;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.set_epoch(epoch);
    V seen;
    for (const auto& batch : *loader)
      for (const auto& example : batch) seen.push_back(static_cast<size_t>(example.data.item<int64_t>()));
    EXPECT_EQ(seen, sampler.indices()) << "epoch " << epoch;
    orders.insert(seen);
  }
  EXPECT_EQ(orders.size(), 3u) << "each epoch reshuffles";
}

TEST(DistributedSampler, SaveLoadKeepsEpochAndPosition) {
  auto s = make(10, 3, 1);
  s.set_epoch(1);
  s.reset();
  s.next(1);
  torch::serialize::OutputArchive out;
  s.save(out);
  std::stringstream buf;
  out.save_to(buf);
  auto t = make(10, 3, 1);
  torch::serialize::InputArchive in;
  in.load_from(buf);
  t.load(in);
  EXPECT_EQ(t.epoch(), 1);
  EXPECT_EQ(*t.next(10), (V{0, 3, 5}));
}

TEST(DistributedSampler, InvalidRankIsRejected) {
  try {
    make(10, 3, 3);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Invalid rank 3, rank should be in the interval [0, 2]"), std::string::npos);
  }
}

TEST(DistributedSampler, NoDefaultGroupNamesTheFix) {
  try {
    DistributedSampler s(10);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("init_process_group"), std::string::npos);
  }
}

// A shuffling sampler's second pass (reset(), a DataLoader's epoch start) in the same epoch (set_epoch
// forgotten) warns, once per epoch, naming the fix; asking indices() says nothing however often it is asked;
// with set_epoch between passes, or without shuffling, nothing is said.
TEST(DistributedSampler, ASecondPassInOneEpochWarnsOncePerEpochAndIndicesNever) {
  auto warned = [](const std::function<void(DistributedSampler&)>& passes, bool shuffle) {
    auto s = make(10, 2, 0, shuffle);
    ::testing::internal::CaptureStderr();
    passes(s);
    return ::testing::internal::GetCapturedStderr();
  };
  const auto count = [](const std::string& text) {
    size_t n = 0;
    for (auto at = text.find("set_epoch(epoch)"); at != std::string::npos; at = text.find("set_epoch(epoch)", at + 1))
      ++n;
    return n;
  };
  const auto forgotten = warned([](DistributedSampler& s) { s.reset(), s.reset(), s.reset(); }, true);
  EXPECT_NE(forgotten.find("a new pass over the data in epoch 0 again, in the same order: call sampler.set_epoch"),
            std::string::npos)
      << forgotten;
  EXPECT_EQ(count(forgotten), 1u) << "once: " << forgotten;
  const auto two_epochs = warned(
      [](DistributedSampler& s) { s.reset(), s.reset(), s.set_epoch(1), s.reset(), s.reset(), s.reset(); }, true);
  EXPECT_EQ(count(two_epochs), 2u) << "once per epoch: " << two_epochs;
  EXPECT_NE(two_epochs.find("in epoch 1 again"), std::string::npos) << two_epochs;
  const auto inspected = warned([](DistributedSampler& s) { s.indices(), s.indices(), s.reset(), s.indices(); }, true);
  EXPECT_EQ(inspected.find("DistributedSampler"), std::string::npos) << inspected;
  const auto epochs_set =
      warned([](DistributedSampler& s) { s.reset(), s.set_epoch(1), s.reset(), s.set_epoch(2), s.indices(); }, true);
  EXPECT_EQ(epochs_set.find("DistributedSampler"), std::string::npos) << epochs_set;
  const auto in_order = warned([](DistributedSampler& s) { s.reset(), s.reset(); }, false);
  EXPECT_EQ(in_order.find("DistributedSampler"), std::string::npos) << in_order;
}
