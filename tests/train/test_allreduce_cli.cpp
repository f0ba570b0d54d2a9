// `ampp train` with its workers on one machine reduces gradients through shared memory by default;
// `--gloo-allreduce` goes through Gloo's loopback TCP. Two workers' sums are the same bits either way
// (a+b is commutative), so both runs write the same model.pt.
#include <gtest/gtest.h>

#include <string>

#include "ampp_test.h"
#include "train_cli.h"

namespace {

TEST(AllreduceCli, SharedMemoryAndGlooTrainTheSameModel) {
  ampp_test::TempDir tmp;
  for (const std::string dir : {"shm", "gloo"}) {
    const std::string extra = dir == "gloo" ? "--gloo-allreduce " : "";
    const auto r = ampp_test::run_ampp(
        ampp_test::small_run(tmp.path() / dir, "--nproc 2 --steps 10 --opt-level O1 --dtype bf16 " + extra));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  ampp_test::expect_same_model(tmp.path() / "shm" / "out" / "model.pt", tmp.path() / "gloo" / "out" / "model.pt");
}

}  // namespace
