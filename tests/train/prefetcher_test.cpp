// ampp::train::BatchPrefetcher: the iterator's batches, in its order, with and without a loader thread.
// (On a GPU, its side-stream copies run in the GPU suite's `ampp train` runs: scripts/gpu-check.sh.)
#include <ampp/train/prefetcher.h>
#include <gtest/gtest.h>

#include "ampp_test.h"

using namespace ampp::train;

namespace {

const std::vector<int64_t> kPrefetchIndices = {9, 3, 5, 1, 0, 7, 2, 8, 4, 6, 11};

// Every batch of `prefetcher` equals the plain iterator's from `start`, then it ends, and stays ended.
void expect_iterators_batches(const Dataset& data, bool background, int64_t start) {
  BatchIterator plain(data, kPrefetchIndices, 3, /*drop_last=*/true),
      prefetched(data, kPrefetchIndices, 3, /*drop_last=*/true);
  plain.skip_to(start);
  prefetched.skip_to(start);
  BatchPrefetcher loader(prefetched, PrefetchOptions(torch::kCPU).background(background));
  EXPECT_EQ(loader.num_batches(), 3);
  EXPECT_EQ(loader.position(), start);
  while (auto expected = plain.next()) {
    const auto got = loader.next();
    ASSERT_TRUE(got) << "batch " << plain.position() - 1;
    EXPECT_TRUE(torch::equal(got->data, expected->data));
    EXPECT_TRUE(torch::equal(got->target, expected->target));
    EXPECT_EQ(loader.position(), plain.position());
  }
  EXPECT_FALSE(loader.next());
  EXPECT_FALSE(loader.next());
  EXPECT_EQ(loader.position(), 3);
}

}  // namespace

TEST(Prefetcher, GivesTheIteratorsBatchesInOrderFromAnyStart) {
  const auto pair = make_synthetic(SyntheticOptions().train_size(12).test_size(2));
  for (const bool background : {true, false}) {
    for (const int64_t start : {0, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "background " << background << ", start " << start);
      expect_iterators_batches(pair.train, background, start);
    }
  }
}

// Left mid-epoch (a step limit), or before its first batch: the loader thread stops, nothing hangs.
TEST(Prefetcher, StopsWhenLeftMidEpoch) {
  const auto pair = make_synthetic(SyntheticOptions().train_size(12).test_size(2));
  for (int taken = 0; taken <= 2; ++taken) {
    BatchIterator batches(pair.train, kPrefetchIndices, 3, /*drop_last=*/true);
    BatchPrefetcher loader(batches, PrefetchOptions(torch::kCPU));
    for (int i = 0; i < taken; ++i) ASSERT_TRUE(loader.next());
  }
}

// The loader's error reaches the caller of next(), once; the loader stops there.
TEST(Prefetcher, ThrowsTheLoadersErrorOnce) {
  Dataset broken;  // labels without images: gathering a batch fails
  broken.labels = torch::zeros({6}, torch::kInt64);
  for (const bool background : {true, false}) {
    BatchIterator batches(broken, {0, 1, 2, 3}, 2, /*drop_last=*/true);
    BatchPrefetcher loader(batches, PrefetchOptions(torch::kCPU).background(background));
    EXPECT_THROW(loader.next(), c10::Error);
    EXPECT_FALSE(loader.next());
    EXPECT_EQ(loader.position(), 0);
  }
}
