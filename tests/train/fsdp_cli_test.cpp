// `ampp train --fsdp`: two workers with the model fully sharded between them (the GPT's blocks and the
// ResNet's stages as units, the CNN as one unit) train the model DDP trains, bit for bit (2 ranks: the
// average of two gradients is exact both ways), and their checkpoints are DDP's; what it does not combine
// with is refused by name.
#include <ampp/precision/float8.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "ampp_test.h"
#include "train_cli.h"

namespace {

namespace fs = ampp_test::fs;
using ampp_test::expect_same_model;

std::string run_line(const fs::path& dir, const std::string& model, const std::string& extra) {
  std::string data = "--data synthetic:256";
  if (model == "gpt-tiny") {
    std::string text;
    for (int i = 0; text.size() < 16000; ++i) text += "the cat sat on the mat " + std::to_string(i % 97) + ".\n";
    std::ofstream(dir / "text.txt") << text;
    data = "--data text:" + (dir / "text.txt").string() + " --context 32 --n-embd 64";
  }
  return "train --model " + model + " " + data +
         " --batch-size 32 --deterministic --threads 1 --quiet --no-plots --out " + (dir / "out").string() + " " +
         extra;
}

// A GPT's default clipping is left out: its norm is summed over shards under FSDP, over whole gradients under
// DDP, which may differ in the last bit.
void check_fsdp_trains_as_ddp(const std::string& model, const std::string& precision) {
  ampp_test::TempDir tmp;
  for (const std::string& name : {"ddp", "fsdp"}) {
    fs::create_directories(tmp.path() / name);
    const auto r = ampp_test::run_ampp(
        run_line(tmp.path() / name, model, "--nproc 2 --steps 8 " + precision + (name == "fsdp" ? " --fsdp" : "")));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  expect_same_model(tmp.path() / "ddp" / "out" / "model.pt", tmp.path() / "fsdp" / "out" / "model.pt");
}

TEST(FsdpCli, TheGptsBlocksShardedTrainAsDdpInBf16) {
  check_fsdp_trains_as_ddp("gpt-tiny", "--opt-level O1 --dtype bf16 --clip-grad-norm 0");
}

// fp8 products (float8_linear) on the gathered weights, their gradients reduce-scattered into the shards; the
// delayed recipe's histories (unsharded buffers) reduced over the ranks as under DDP.
TEST(FsdpCli, TheGptsBlocksShardedTrainAsDdpWithFp8Products) {
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  check_fsdp_trains_as_ddp("gpt-tiny", "--opt-level O1 --dtype fp8 --fp8-layers all --clip-grad-norm 0");
  check_fsdp_trains_as_ddp("gpt-tiny",
                           "--opt-level O1 --dtype fp8 --fp8-layers all --fp8-recipe delayed --clip-grad-norm 0");
}

TEST(FsdpCli, TheResNetsStagesShardedTrainAsDdpInFp32) { check_fsdp_trains_as_ddp("resnet", "--opt-level O0"); }

TEST(FsdpCli, TheCnnAsOneUnitTrainsAsDdpWithLossScaling) {
  check_fsdp_trains_as_ddp("cnn", "--opt-level O1 --dtype fp16");
}

// The checkpoints of an FSDP run hold the whole model and AdamW's moments (a GPT's default), as DDP's do: a run stopped
// halfway and resumed, in ampp's format or from PyTorch's, under FSDP or DDP, ends with the uninterrupted DDP run's
// model, bit for bit (2 workers, the GPT's blocks as units).
TEST(FsdpCli, ItsCheckpointsAreDdpsAndResumeUnderEither) {
  ampp_test::TempDir tmp;
  auto run = [&](const std::string& dir, const std::string& extra) {
    fs::create_directories(tmp.path() / dir);
    const auto r =
        ampp_test::run_ampp(run_line(tmp.path() / dir, "gpt-tiny",
                                     "--nproc 2 --opt-level O1 --dtype bf16 --clip-grad-norm 0 --lr-decay-steps 8 "
                                     "--checkpoint-dir " +
                                         (tmp.path() / dir / "ckpt").string() + " " + extra));
    ASSERT_EQ(r.code, 0) << r.output;
  };
  const auto model = [&](const std::string& dir) { return tmp.path() / dir / "out" / "model.pt"; };
  run("ddp", "--steps 8");
  run("fsdp-then-fsdp", "--steps 4 --fsdp");
  const auto start = tmp.path() / "start.pt";  // PyTorch's format, written by the FSDP run
  fs::copy_file(tmp.path() / "fsdp-then-fsdp" / "ckpt" / "checkpoint.pt", start);
  run("fsdp-then-fsdp", "--steps 8 --fsdp --resume");
  expect_same_model(model("ddp"), model("fsdp-then-fsdp"));
  // rank 0's file must hold rank 1's rows too
  ampp_test::expect_resumes_as(run, tmp.path(), "ddp", "fsdp-then-ddp", "--steps 4 --fsdp", "--steps 8 --resume");
  ampp_test::expect_resumes_as(run, tmp.path(), "ddp", "ddp-then-fsdp", "--steps 4", "--steps 8 --fsdp --resume");
  run("pt-then-fsdp", "--steps 8 --fsdp --resume-from " + start.string());
  expect_same_model(model("ddp"), model("pt-then-fsdp"));
}

TEST(FsdpCli, WhatItDoesNotCombineWithIsRefusedByName) {
  ampp_test::TempDir tmp;
  const auto o2 = ampp_test::run_ampp(run_line(tmp.path(), "cnn", "--nproc 1 --fsdp --opt-level O2"));
  EXPECT_NE(o2.code, 0);
  EXPECT_NE(o2.output.find("use -O0 or -O1"), std::string::npos) << o2.output;
  const auto zero = ampp_test::run_ampp(run_line(tmp.path(), "cnn", "--nproc 1 --fsdp --zero"));
  EXPECT_NE(zero.code, 0);
  EXPECT_NE(zero.output.find("already shards the optimizer state; drop --zero"), std::string::npos) << zero.output;
}

TEST(FsdpCli, OneWorkerIsToldThatNothingIsSharded) {
  ampp_test::TempDir tmp;
  auto line = run_line(tmp.path(), "cnn", "--nproc 1 --steps 1 --fsdp");
  line.replace(line.find(" --quiet"), 8, "");  // the note is progress output
  const auto r = ampp_test::run_ampp(line);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--fsdp shards the model over the workers, and this run has one"), std::string::npos)
      << r.output;
}

}  // namespace
