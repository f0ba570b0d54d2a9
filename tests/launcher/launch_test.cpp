// ampp::dist::launch as a library call (what `ampp train --nproc N` uses).
#include <gmock/gmock.h>

#include <gtest/gtest.h>
#include "ampp_test.h"

#include <c10/util/Exception.h>

#include <ampp/dist/launcher.h>

namespace {

using ::testing::HasSubstr;

std::string validation_error(const ampp::dist::LaunchOptions& options) {
  return ampp_test::error_of([&] { ampp::dist::validate(options); });
}

TEST(Launch, ValidateNamesTheBadOptionAndTheFix) {
  using ampp::dist::LaunchOptions;
  EXPECT_EQ(validation_error(LaunchOptions()), "<no error>");
  EXPECT_THAT(validation_error(LaunchOptions().nproc_per_node(0)),
              HasSubstr("LaunchOptions::nproc_per_node must be >= 1 (got 0)"));
  EXPECT_THAT(validation_error(LaunchOptions().nnodes(3).node_rank(3)),
              HasSubstr("give each node a distinct rank in 0..2"));
  EXPECT_THAT(validation_error(LaunchOptions().node_rank(-1)),
              HasSubstr("LaunchOptions::node_rank -1 is out of range"));
  EXPECT_THAT(validation_error(LaunchOptions().master_port(65536)), HasSubstr("use a TCP port in 1..65535"));
  EXPECT_THAT(validation_error(LaunchOptions().master_port(-1)),
              HasSubstr("LaunchOptions::master_port -1 is out of range"));
  EXPECT_THAT(validation_error(LaunchOptions().nnodes(0)), HasSubstr("LaunchOptions::nnodes must be >= 1 (got 0)"));
  EXPECT_THAT(validation_error(LaunchOptions().max_restarts(-2)),
              HasSubstr("LaunchOptions::max_restarts must be >= 0 (got -2)"));
  EXPECT_THAT(validation_error(LaunchOptions().master_addr("")), HasSubstr("LaunchOptions::master_addr is empty"));
  EXPECT_THAT(validation_error(LaunchOptions().shutdown_grace(std::chrono::milliseconds(-1))),
              HasSubstr("grace period must be >= 0"));
}

TEST(Launch, ReturnsZeroWhenEveryWorkerSucceedsAndOneOtherwise) {
  const auto quiet = ampp::dist::LaunchOptions().nproc_per_node(2).verbose(false);
  EXPECT_EQ(ampp::dist::launch(quiet, {"sh", "-c", "exit 0"}), 0);
  // Rank 1 fails: launch reports it (on stderr) and returns torchrun's exit status 1.
  EXPECT_EQ(ampp::dist::launch(quiet, {"sh", "-c", "test \"$RANK\" != 1"}), 1);
  // The launcher's signal handlers are restored afterwards, so it can run again.
  EXPECT_EQ(ampp::dist::launch(quiet, {"true"}), 0);
}

TEST(Launch, RejectsAnEmptyCommandLine) {
  AMPP_EXPECT_THROW_WITH(ampp::dist::launch(ampp::dist::LaunchOptions(), {}), "no program given");
}

}  // namespace
