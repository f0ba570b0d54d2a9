// `ampp train --cuda-graphs` without a GPU: the step a graph captures (the eager step, with Amp's loss scaler
// and its skip on the device, the loss and accuracy summed on the device, the lr looked up there) runs eagerly
// on the CPU with --host-reads log-points, read only every --log-every steps as a GPU run reads it. It must
// train the eager trainer's model (which reads after every step on the CPU) bit for bit, with the same
// losses, skips and loss scale, at every opt level, and its checkpoints resume exactly. What a graph cannot
// capture is refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <string>

#include "ampp_test.h"
#include "train_cli.h"

namespace {

namespace fs = ampp_test::fs;

// The step a GPU captures, read as a GPU run reads it.
const std::string kAsGraphed = "--host-reads log-points";

std::string run_line(const fs::path& dir, const std::string& extra) {
  const std::string workers = extra.find("--nproc") == std::string::npos ? "--nproc 1 " : "";
  const std::string epochs = extra.find("--epochs") == std::string::npos ? "--epochs 2 " : "";
  return "train --data synthetic:384 --model cnn --batch-size 32 --deterministic --threads 1 --quiet --no-plots " +
         workers + epochs + "--log-every 5 --out " + (dir / "out").string() + " " + extra;
}

nlohmann::json summary_json_of(const fs::path& dir) {
  std::ifstream in(dir / "out" / "summary.json");
  return nlohmann::json::parse(in);
}

// The eager trainer and the graphed step path, both on the CPU, for one precision; `env` injects faults.
void check_graphed_path_trains_as_eager(const std::string& precision, const std::string& env = "") {
  ampp_test::TempDir tmp;
  auto r = ampp_test::run_shell(env + AMPP_FAULTS_CLI + " " + run_line(tmp.path() / "eager", precision));
  ASSERT_EQ(r.code, 0) << r.output;
  r = ampp_test::run_shell(env + AMPP_FAULTS_CLI + " " +
                           run_line(tmp.path() / "graphed", precision + " " + kAsGraphed));
  ASSERT_EQ(r.code, 0) << r.output;
  ampp_test::expect_same_model(tmp.path() / "eager" / "out" / "model.pt", tmp.path() / "graphed" / "out" / "model.pt");
  const auto eager = summary_json_of(tmp.path() / "eager"), graphed = summary_json_of(tmp.path() / "graphed");
  for (const char* key : {"steps", "skipped_steps", "final_loss_scale", "train_loss", "test_loss", "test_accuracy"})
    EXPECT_EQ(graphed.at(key), eager.at(key)) << key;
}

TEST(CudaGraphsCli, TheGraphedStepPathTrainsAsTheEagerStepInFp32) {
  check_graphed_path_trains_as_eager("--opt-level O0");
}

TEST(CudaGraphsCli, TheGraphedStepPathTrainsAsTheEagerStepInBf16) {
  check_graphed_path_trains_as_eager("--opt-level O1 --dtype bf16");
}

// Dynamic loss scaling, with an inf at step 3: both skip it and back the scale off alike.
TEST(CudaGraphsCli, TheGraphedStepPathSkipsAndScalesAsTheEagerStepInFp16) {
  check_graphed_path_trains_as_eager("--opt-level O1 --dtype fp16", "AMPP_TRAIN_TEST_INF_AT=3:0 ");
}

// O2's FP32 masters (apex's cap on the dynamic scale, which the device's rule keeps), O3's low-precision
// model with its own inf check, the lr warm-up (eager steps, then the graph) and clipping, on the device.
TEST(CudaGraphsCli, TheGraphedStepPathTrainsAsTheEagerStepAtO2AndO3WithWarmupAndClipping) {
  check_graphed_path_trains_as_eager("--opt-level O2 --dtype fp16", "AMPP_TRAIN_TEST_INF_AT=4:0 ");
  check_graphed_path_trains_as_eager("--opt-level O2 --dtype bf16 --warmup-steps 5 --clip-grad-norm 1");
  check_graphed_path_trains_as_eager("--opt-level O3 --dtype bf16", "AMPP_TRAIN_TEST_INF_AT=2:0 ");
}

// metrics.jsonl's lr by step.
std::map<int64_t, double> lr_by_step(const fs::path& dir) {
  std::map<int64_t, double> lr;
  std::ifstream in(dir / "out" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == "step") lr[j.at("step").get<int64_t>()] = j.at("lr").get<double>();
  }
  return lr;
}

// metrics.jsonl's lr at each logged step of a run that reads every step and of one that reads at log points
// (`as_on_a_gpu`), both with the test faults in `env`: equal, value for value.
std::map<int64_t, double> expect_the_same_lr_at_every_log_point(const std::string& flags,
                                                                const std::string& as_on_a_gpu,
                                                                const std::string& env) {
  ampp_test::TempDir tmp;
  for (const std::string& extra : {std::string(), as_on_a_gpu}) {
    const auto r = ampp_test::run_shell(env + AMPP_FAULTS_CLI + " " +
                                        run_line(tmp.path() / (extra.empty() ? "reads" : "device"), flags + extra));
    EXPECT_EQ(r.code, 0) << r.output;
  }
  const auto reads = lr_by_step(tmp.path() / "reads"), device = lr_by_step(tmp.path() / "device");
  EXPECT_EQ(device.count(10), 1U);
  for (const auto& [step, lr] : device) EXPECT_EQ(lr, reads.count(step) ? reads.at(step) : -1.0) << "step " << step;
  return device;
}

// The cosine schedule (a GPT's default) where the host reads only every --log-every steps: each step's lr
// looked up on the device at the skip ledger's steps taken, so the inf at step 6 (skipped) holds it back
// at once, as on the trainer that reads every step, not at the next read. With AdamW and the warmup first;
// as a graph steps, and through ampp::FusedAdamW (--fused-optimizer), which reads the lr tensor itself.
TEST(CudaGraphsCli, TheGraphedStepPathFollowsTheCosineScheduleAsTheEagerStep) {
  const std::string cosine = "--opt-level O1 --dtype fp16 --optimizer adamw --lr-schedule cosine --warmup-steps 3";
  const std::string inf = "AMPP_TRAIN_TEST_INF_AT=6:0 ";
  check_graphed_path_trains_as_eager(cosine, inf);
  check_graphed_path_trains_as_eager(cosine + " --fused-optimizer", inf);
  expect_the_same_lr_at_every_log_point(cosine, " --fused-optimizer --host-reads log-points", inf);
}

// StepLR after a warmup, read only at log points: the skip at step 2, inside the warmup, holds the warmup
// back at once (the host no longer reads each warmup step to count it), and the decay of --lr-step 1 starts
// with the third epoch's first step (LibTorch's StepLR, docs/training.md), from that epoch's table, as on the
// trainer that reads every step.
TEST(CudaGraphsCli, TheGraphedStepPathFollowsTheWarmupAndStepLrAsTheEagerStep) {
  const std::string step_lr = "--opt-level O1 --dtype fp16 --warmup-steps 8 --lr-step 1 --epochs 3";
  const std::string inf = "AMPP_TRAIN_TEST_INF_AT=2:0 ";
  check_graphed_path_trains_as_eager(step_lr, inf);
  const auto lr = expect_the_same_lr_at_every_log_point(step_lr, " --fused-optimizer --host-reads log-points", inf);
  ASSERT_TRUE(lr.count(5) && lr.count(20) && lr.count(30)) << "logged steps";
  EXPECT_LT(lr.at(5), lr.at(20)) << "warming up at step 5 (one step skipped)";
  EXPECT_NEAR(lr.at(30), lr.at(20) * 0.1, 1e-12) << "decayed in the third epoch";
}

// Checkpoints: a graphed run stopped mid-epoch (step 18 of 24) and resumed ends with the uninterrupted eager
// run's model, skips and scale; its checkpoint is the eager trainer's, which resumes it too.
TEST(CudaGraphsCli, ItsCheckpointsResumeExactlyUnderEitherStep) {
  ampp_test::TempDir tmp;
  const std::string fp16 = "--opt-level O1 --dtype fp16 ", inf = "AMPP_TRAIN_TEST_INF_AT=3:0,20:0 ";
  auto run = [&](const std::string& dir, const std::string& env, const std::string& extra) {
    const auto r = ampp_test::run_shell(
        inf + env + AMPP_FAULTS_CLI + " " +
        run_line(tmp.path() / dir, fp16 + "--checkpoint-dir " + (tmp.path() / dir / "ckpt").string() + " " + extra));
    ASSERT_EQ(r.code, 0) << r.output;
  };
  run("eager", "", "");
  run("graphed", "", kAsGraphed + " --steps 18");
  run("graphed", "", kAsGraphed + " --resume");
  run("graphed-then-eager", "", kAsGraphed + " --steps 18");
  run("graphed-then-eager", "", "--resume");
  for (const std::string dir : {"graphed", "graphed-then-eager"}) {
    ampp_test::expect_same_model(tmp.path() / "eager" / "out" / "model.pt", tmp.path() / dir / "out" / "model.pt");
    const auto eager = summary_json_of(tmp.path() / "eager"), resumed = summary_json_of(tmp.path() / dir);
    for (const char* key : {"steps", "skipped_steps", "final_loss_scale", "train_loss"})
      EXPECT_EQ(resumed.at(key), eager.at(key)) << dir << ": " << key;
  }
}

TEST(CudaGraphsCli, WhatCannotBeCapturedIsRefusedByName) {
  ampp_test::TempDir tmp;
  const auto refused = [&](const std::string& env, const std::string& extra, const std::string& message) {
    const auto r = ampp_test::run_shell(env + AMPP_FAULTS_CLI + " " + run_line(tmp.path(), "--cuda-graphs " + extra));
    EXPECT_NE(r.code, 0) << extra;
    EXPECT_NE(r.output.find(message), std::string::npos) << extra << ": " << r.output;
  };
  refused("", "", "CUDA graphs need a GPU; use --device cuda");
  refused("", "--doctor", "--doctor and --profile read every step on the host");
  refused("", "--no-fused-optimizer", "drop --no-fused-optimizer");
}

}  // namespace

// The divergence stop reads the device only every --log-every steps, yet stops as the eager trainer does,
// naming the same steps: 3 skips in a row (--max-consecutive-skips 3) followed by finite steps before the
// read, and 4 skips in the last 6 steps with at most 2 in a row.
TEST(CudaGraphsCli, StopsOnTheEagerTrainersSkipRulesBetweenReads) {
  ampp_test::TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"4:0,5:0,6:0", "steps 4 to 6 (3 in a row"}, {"2:0,4:0,6:0,7:0", "4 of the last 6 steps (to step 7)"}};
  for (const auto& [infs, rule] : cases) {
    for (const std::string graphed : {std::string(), kAsGraphed}) {
      const auto r = ampp_test::run_shell("AMPP_TRAIN_TEST_INF_AT=" + infs + " " + AMPP_FAULTS_CLI + " " +
                                          run_line(tmp.path() / ((graphed.empty() ? "eager" : "graphed") + infs),
                                                   "--opt-level O1 --dtype fp16 --max-consecutive-skips 3 " + graphed));
      EXPECT_NE(r.code, 0) << r.output;
      EXPECT_NE(r.output.find("the run diverged: " + rule), std::string::npos) << graphed << "\n" << r.output;
    }
  }
}
