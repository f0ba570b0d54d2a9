// InitOptions::check_collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL): a rank that calls a collective with
// another shape, or never calls it, makes every rank fail with a message naming both sides, within
// the timeout, instead of hanging (or, worse, reducing mismatched buffers).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "multiprocess.h"

namespace ampp_test {
namespace {

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

ProcessGroup init_checked(int rank, int port, std::chrono::milliseconds timeout) {
  return init_process_group(InitOptions()
                                .init_method("tcp://127.0.0.1:" + std::to_string(port))
                                .rank(rank)
                                .world_size(2)
                                .timeout(timeout)
                                .check_collectives(true));
}

// The error of an allreduce of `shape` on this rank ("" when it succeeded).
std::string allreduce_error(const ProcessGroup& pg, std::vector<int64_t> shape) {
  std::vector<torch::Tensor> t{torch::ones(shape)};
  try {
    pg.c10d()->allreduce(t)->wait();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(CollectiveChecks, MatchingCollectivesRunAsUsual) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = init_checked(rank, port, std::chrono::seconds(20));
    std::vector<torch::Tensor> t{torch::full({3}, rank + 1.0)};
    pg.c10d()->allreduce(t)->wait();
    EXPECT_TRUE(t[0].equal(torch::full({3}, 3.0)));
  }));
}

TEST(CollectiveChecks, AnotherShapeOnOneRankFailsEveryRankNamingBoth) {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = init_checked(rank, port, std::chrono::seconds(20));
    const std::string error = allreduce_error(pg, {rank == 0 ? 20 : 21, 10});
    EXPECT_HAS(error, "mismatch");
    EXPECT_HAS(error, "20, 10");
    EXPECT_HAS(error, "21, 10");
  }));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15)) << "no timeout needed to see it";
}

TEST(CollectiveChecks, ARankThatNeverCallsIsNamedAfterTheTimeout) {
  const int port = free_port();
  expect_all_ok(run_ranks(
      2,
      [&](int rank) {
        auto pg = init_checked(rank, port, std::chrono::seconds(3));
        if (rank == 1) {  // skips the collective (a backward it did not run), stays alive a while
          std::this_thread::sleep_for(std::chrono::seconds(6));
          return;
        }
        const std::string error = allreduce_error(pg, {4});
        EXPECT_HAS(error, "1 failed to pass monitoredBarrier");  // upstream: "Ranks 1 failed to pass ..."
      },
      std::chrono::seconds(30)));
}

}  // namespace
}  // namespace ampp_test
