// `ampp train --zero`: two workers with the SGD momentum sharded between them train the model they
// train without it, bit for bit, and their checkpoints (the whole state, gathered on rank 0) resume
// either way: a --zero run continues without it, a run continues with --zero from a PyTorch file.
#include <gtest/gtest.h>

#include <string>

#include "ampp_test.h"
#include "train_cli.h"

namespace {

namespace fs = ampp_test::fs;
using ampp_test::expect_same_model;

TEST(ZeroCli, ShardedTrainingAndItsCheckpointsAreThoseOfUnshardedTraining) {
  ampp_test::TempDir tmp;
  auto run = [&](const std::string& dir, const std::string& extra) {
    const auto r =
        ampp_test::run_ampp(ampp_test::small_run(tmp.path() / dir, "--nproc 2 --opt-level O1 --dtype bf16 " + extra));
    EXPECT_EQ(r.code, 0) << r.output;
  };
  const auto model = [&](const std::string& dir) { return tmp.path() / dir / "out" / "model.pt"; };
  run("plain", "--steps 10");
  run("zero", "--steps 10 --zero");
  expect_same_model(model("plain"), model("zero"));

  run("zero-then-plain", "--steps 5 --zero");  // rank 0's checkpoint must hold rank 1's momentum too
  run("zero-then-plain", "--steps 10 --resume");
  expect_same_model(model("plain"), model("zero-then-plain"));

  run("plain-then-zero", "--steps 5");
  const auto start = tmp.path() / "start.pt";
  fs::copy_file(tmp.path() / "plain-then-zero" / "ckpt" / "checkpoint.pt", start);
  run("plain-then-zero", "--steps 10 --zero --resume-from " + start.string());
  expect_same_model(model("plain"), model("plain-then-zero"));
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

TEST(ZeroCli, O2IsRefusedWithTheReason) {
  ampp_test::TempDir dir;
  const auto r = ampp_test::run_ampp("train --data synthetic:64 --zero --opt-level O2 --quiet --out " +
                                     (dir.path() / "out").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("cannot checkpoint O2's sharded FP32 masters yet"), std::string::npos) << r.output;
}

}  // namespace
