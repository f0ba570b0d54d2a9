// `ampp train --zero`: two workers with the SGD momentum (and under O2 the FP32 masters) sharded between
// them train the model they train without it, bit for bit, and their checkpoints (the whole state,
// gathered on rank 0) resume either way, in ampp's format and in PyTorch's.
#include <gtest/gtest.h>

#include <string>

#include "ampp_test.h"
#include "train_cli.h"

namespace {

namespace fs = ampp_test::fs;
using ampp_test::expect_same_model;

// Sharded training equals unsharded training bit for bit, and a checkpoint of either resumes as the other.
void check_zero_is_unsharded_training(const std::string& precision) {
  ampp_test::TempDir tmp;
  auto run = [&](const std::string& dir, const std::string& extra) {
    const auto r = ampp_test::run_ampp(ampp_test::small_run(tmp.path() / dir, "--nproc 2 " + precision + " " + extra));
    EXPECT_EQ(r.code, 0) << r.output;
  };
  const auto model = [&](const std::string& dir) { return tmp.path() / dir / "out" / "model.pt"; };
  run("plain", "--steps 10");
  run("zero", "--steps 10 --zero");
  expect_same_model(model("plain"), model("zero"));

  // rank 0's checkpoint must hold rank 1's shard too
  ampp_test::expect_resumes_as(run, tmp.path(), "plain", "zero-then-plain", "--steps 5 --zero", "--steps 10 --resume");
  ampp_test::expect_resumes_as(run, tmp.path(), "plain", "plain-then-zero", "--steps 5", "--steps 10 --zero --resume");

  run("pt-then-zero", "--steps 5");
  const auto start = tmp.path() / "start.pt";
  fs::copy_file(tmp.path() / "pt-then-zero" / "ckpt" / "checkpoint.pt", start);
  run("pt-then-zero", "--steps 10 --zero --resume-from " + start.string());
  expect_same_model(model("plain"), model("pt-then-zero"));

  run("zero-pt-then-plain", "--steps 5 --zero");  // checkpoint.pt: every shard's values
  const auto zero_start = tmp.path() / "zero-start.pt";
  fs::copy_file(tmp.path() / "zero-pt-then-plain" / "ckpt" / "checkpoint.pt", zero_start);
  ampp::remove_tree((tmp.path() / "zero-pt-then-plain" / "ckpt").string());
  run("zero-pt-then-plain", "--steps 10 --resume-from " + zero_start.string());
  expect_same_model(model("plain"), model("zero-pt-then-plain"));
}

TEST(ZeroCli, ShardedTrainingAndItsCheckpointsAreThoseOfUnshardedTraining) {
  check_zero_is_unsharded_training("--opt-level O1 --dtype bf16");
}

// Under O2 each rank keeps the FP32 masters of its shard only; checkpoints hold every shard's.
TEST(ZeroCli, UnderO2TheShardedMastersAreCheckpointedWhole) {
  check_zero_is_unsharded_training("--opt-level O2 --dtype bf16");
}

TEST(ZeroCli, OneWorkerIsToldThatNothingIsSharded) {
  ampp_test::TempDir dir;
  const auto r =
      ampp_test::run_ampp("train --data synthetic:64 --batch-size 32 --steps 1 --nproc 1 --zero --no-plots --out " +
                          (dir.path() / "out").string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("note: --zero shards the optimizer state over the workers, and this run has one"),
            std::string::npos)
      << r.output;
}

}  // namespace
