// parallel_chunks: at::parallel_for's split of the work, on LibTorch's own OpenMP pool, whichever compiler
// built ampp (Note [one OpenMP pool, any compiler] in numerics/parallel_chunks.h). A clang build that
// compiled `#pragma omp` without OpenMP ran all of it on one thread: ThreadsOfLibTorchsPool catches that.

#include "ampp/numerics/parallel_chunks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace {

using ampp::numerics::detail::parallel_chunks;

// Restores LibTorch's intra-op thread count after a test changes it.
struct ThreadCount {
  int saved = at::get_num_threads();
  explicit ThreadCount(int n) { at::set_num_threads(n); }
  ~ThreadCount() { at::set_num_threads(saved); }
};

std::vector<std::pair<int64_t, int64_t>> ranges_of(int64_t n, int64_t grain) {
  std::mutex m;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  parallel_chunks(n, grain, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(m);
    ranges.emplace_back(b, e);
  });
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

// The split of ATen's invoke_parallel: each of the team's threads one contiguous range of ceil(n / threads).
// (Not compared with at::parallel_for called here: this file, like any compiled without -fopenmp, would
// run it on one thread, which is the problem parallel_chunks solves.)
TEST(ParallelChunks, CoversEveryItemOnceInTheRangesParallelForWouldUse) {
  ThreadCount two(2);
  EXPECT_EQ(ranges_of(10, 1), (std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 10}}));
  EXPECT_EQ(ranges_of(7, 1), (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 7}}));
  EXPECT_EQ(ranges_of(5, 5), (std::vector<std::pair<int64_t, int64_t>>{{0, 5}}));  // not above the grain: serial
  EXPECT_EQ(ranges_of(1, 0), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}}));
  EXPECT_TRUE(ranges_of(0, 1).empty());
}

TEST(ParallelChunks, ThreadsOfLibTorchsPool) {
  ThreadCount two(2);
  std::mutex m;
  std::set<std::thread::id> threads;
  bool nested_in_region = false;
  parallel_chunks(1000, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(m);
    threads.insert(std::this_thread::get_id());
    nested_in_region = at::in_parallel_region();
  });
  EXPECT_EQ(threads.size(), 2u) << "at::set_num_threads(2) must give two threads";
  EXPECT_TRUE(nested_in_region) << "LibTorch must see its own parallel region (nested ops then run serially)";
}

TEST(ParallelChunks, OneThreadOrANestedRegionRunsSerially) {
  {
    ThreadCount one(1);
    EXPECT_EQ(ranges_of(100, 1), (std::vector<std::pair<int64_t, int64_t>>{{0, 100}}));
  }
  ThreadCount two(2);
  std::mutex m;
  std::vector<size_t> inner_calls;
  parallel_chunks(2, 1, [&](int64_t, int64_t) {
    size_t calls = 0;
    parallel_chunks(100, 1, [&](int64_t, int64_t) { ++calls; });
    std::lock_guard<std::mutex> lock(m);
    inner_calls.push_back(calls);
  });
  EXPECT_EQ(inner_calls, (std::vector<size_t>{1, 1}));
}

TEST(ParallelChunks, AnExceptionReachesTheCaller) {
  ThreadCount two(2);
  EXPECT_THROW(parallel_chunks(100, 1,
                               [](int64_t b, int64_t) {
                                 if (b == 0) throw std::runtime_error("chunk 0 failed");
                               }),
               std::runtime_error);
}

}  // namespace
