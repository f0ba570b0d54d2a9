// `ampp train` never ends "successfully" with nothing useful and never loses its outputs: a diverged
// run stops with a reason, outputs are all-or-nothing, a finished run is not overwritten on resume,
// unusable folders fail before training, one run per output folder. Each test failed before the fix.
#include <ampp/train/checkpoint.h>
#include <ampp/train/metrics.h>
#include <ampp/util/folder_lock.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include "ampp/train/report_json.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampp_test.h"
#include "train_cli.h"

namespace fs = std::filesystem;
using ampp_test::run_ampp;
using ampp_test::small_run;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

std::vector<nlohmann::json> records_of_type(const fs::path& metrics, const std::string& type) {
  std::vector<nlohmann::json> out;
  for (auto& j : ampp::train::read_jsonl(metrics.string()))
    if (j.value("type", "") == type) out.push_back(j);
  return out;
}

// The diverged run: exit 1, the reason, an error record in metrics.jsonl, no model.pt.
void expect_diverged(const std::string& flags, const std::string& hint) {
  ampp_test::TempDir tmp;
  const auto r = run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 3 --max-consecutive-skips 5 " + flags));
  EXPECT_EQ(r.code, 1) << flags << "\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("the run diverged: steps ")) << flags;
  EXPECT_THAT(r.output, HasSubstr("(5 in a row, --max-consecutive-skips) had inf/NaN gradients")) << flags;
  EXPECT_THAT(r.output, HasSubstr(hint)) << flags << "\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("the last of them had inf/NaN gradients in ")) << flags;
  EXPECT_FALSE(fs::exists(tmp.path() / "out" / "model.pt")) << flags;
  const auto errors = records_of_type(tmp.path() / "out" / "metrics.jsonl", "error");
  ASSERT_EQ(errors.size(), 1u) << flags;
  EXPECT_EQ(errors[0]["cause"], "diverged");
  // Every skipped step's record names the parameters whose gradients were inf/NaN.
  for (const auto& step : records_of_type(tmp.path() / "out" / "metrics.jsonl", "step")) {
    if (!step["skipped"].get<bool>()) continue;
    ASSERT_TRUE(step.contains("overflowed")) << step.dump();
    EXPECT_FALSE(step["overflowed"].empty()) << step.dump();
  }
}

}  // namespace

// Before: exit 0 with NaN weights (O0) or 599 of 600 steps skipped (O1 fp16) and a useless model.pt.
TEST(TrainReliability, ADivergedRunStopsWithTheReasonAtEveryOptLevel) {
  expect_diverged("--lr 1e4 --opt-level O0", "lower --lr (10000)");
  expect_diverged("--lr 1e4 --opt-level O1 --dtype fp16", "the dynamic loss scale backed off to");
  expect_diverged("--lr 1e4 --opt-level O2 --dtype bf16", "lower --lr (10000)");
  expect_diverged("--opt-level O1 --dtype fp16 --loss-scale 1e30", "the static loss scale 1e+30 may overflow");
}

// The numerics doctor's attribution in ampp train: an inf loss at step 3 makes every gradient inf/NaN,
// and the skipped step's record names every parameter by its module path.
TEST(TrainReliability, ASkippedStepNamesTheParametersWhoseGradientsOverflowed) {
  ampp_test::TempDir tmp;
  const auto r = ampp_test::run_shell(std::string("AMPP_TRAIN_TEST_INF_AT=3:0 ") + AMPP_FAULTS_CLI + " " +
                                      small_run(tmp.path(), "--nproc 1 --steps 4 --opt-level O1 --dtype fp16"));
  ASSERT_EQ(r.code, 0) << r.output;
  int skipped = 0;
  for (const auto& step : records_of_type(tmp.path() / "out" / "metrics.jsonl", "step")) {
    EXPECT_EQ(step.contains("overflowed"), step["skipped"].get<bool>()) << step.dump();
    if (!step["skipped"].get<bool>()) continue;
    ++skipped;
    EXPECT_EQ(step["step"], 3);
    const auto names = step["overflowed"].get<std::vector<std::string>>();
    EXPECT_THAT(names, ::testing::Contains("fc1.weight")) << step.dump();
    EXPECT_GE(names.size(), 4u) << step.dump();
  }
  EXPECT_EQ(skipped, 1);
}

// At every opt level (O3: fp16 weights that a taken step can overflow), a checkpoint holds the last
// finite weights.
class DivergedCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(DivergedCheckpoint, NoNaNReachesTheWeightsOrTheBatchNormStatisticsOfADivergedRun) {
  ampp_test::TempDir tmp;
  const auto r = run_ampp(small_run(tmp.path(),
                                    "--nproc 1 --epochs 3 --max-consecutive-skips 5 --lr 1e4 "
                                    "--checkpoint-every 1 --opt-level " +
                                        GetParam()));
  ASSERT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the run diverged: "));
  torch::serialize::InputArchive archive, model;
  ampp::train::load_checkpoint(archive, (tmp.path() / "ckpt" / "checkpoint.ampp").string());
  archive.read("model", model);
  std::map<std::string, torch::Tensor> tensors;
  ampp_test::collect_tensors(model, "", tensors);
  ASSERT_FALSE(tensors.empty());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << name;
}

INSTANTIATE_TEST_SUITE_P(TrainReliability, DivergedCheckpoint, ::testing::Values("O0", "O3"));

// Before: exit 0 and a model.pt with a NaN test loss, when the run was too short for a streak of
// max_consecutive_skips (19 of 20 steps skipped), or one finite step broke the streak (26 of 31
// skipped at O2 bf16, weights up to 1.9e25).
TEST(TrainReliability, ShortRunsAndBrokenStreaksThatDivergeFail) {
  for (const std::string flags : {"--lr 1e30 --steps 20", "--opt-level O2 --dtype bf16 --lr 1e4 --steps 40"}) {
    ampp_test::TempDir tmp;
    // The issue's command: the mlp on 2,000 synthetic images.
    const auto r =
        run_ampp("train --data synthetic:2000 --model mlp --epochs 10 --nproc 1 --quiet --no-plots --out " +
                 (tmp.path() / "out").string() + " --checkpoint-dir " + (tmp.path() / "ckpt").string() + " " + flags);
    EXPECT_EQ(r.code, 1) << flags << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("the run diverged: ")) << flags;
    EXPECT_FALSE(fs::exists(tmp.path() / "out" / "model.pt")) << flags;
    EXPECT_FALSE(fs::exists(tmp.path() / "out" / "summary.json")) << flags;
    const fs::path ckpt = tmp.path() / "ckpt" / "checkpoint.ampp";
    if (!fs::exists(ckpt)) continue;  // no checkpoint was written: none holds non-finite weights
    torch::serialize::InputArchive archive, model;
    ampp::train::load_checkpoint(archive, ckpt.string());
    archive.read("model", model);
    std::map<std::string, torch::Tensor> tensors;
    ampp_test::collect_tensors(model, "", tensors);
    for (const auto& [name, t] : tensors) EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << flags << " " << name;
  }
}

// Before: --resume took the checkpoint's SGD settings and silently ignored different flags.
TEST(TrainReliability, ResumingWithOtherSgdSettingsSaysWhichFlagsToPass) {
  ampp_test::TempDir tmp;
  ASSERT_EQ(run_ampp(small_run(tmp.path(), "--nproc 1 --steps 3 --momentum 0.9")).code, 0);
  const auto r = run_ampp(small_run(tmp.path(), "--nproc 1 --steps 6 --momentum 0.5 --resume"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("was trained with SGD momentum 0.9 and weight decay 0.0001; this run has momentum 0.5"));
  EXPECT_THAT(r.output, HasSubstr("pass --momentum 0.9 --weight-decay 0.0001"));
}

// Before: a rerun into the same --out that failed left the earlier run's summary.json (which says
// "the outputs are complete") beside its own partial metrics.jsonl.
TEST(TrainReliability, AFailedRerunLeavesNoStaleSummary) {
  ampp_test::TempDir tmp;
  ASSERT_EQ(run_ampp(small_run(tmp.path(), "--nproc 1 --steps 3")).code, 0);
  ASSERT_TRUE(fs::exists(tmp.path() / "out" / "summary.json"));
  ampp::remove_tree((tmp.path() / "ckpt").string());
  const auto r = run_ampp(small_run(tmp.path(), "--nproc 1 --steps 20 --lr 1e30"));
  ASSERT_EQ(r.code, 1) << r.output;
  EXPECT_FALSE(fs::exists(tmp.path() / "out" / "summary.json"));
}

// One taken step between streaks does not hide a run that skips most of its steps: more than L of
// the last 2L steps skipped is divergence too (L = --max-consecutive-skips).
TEST(TrainReliability, AStreakBrokenByOneFiniteStepIsStillDivergence) {
  ampp_test::TempDir tmp;
  const auto r = ampp_test::run_shell(
      std::string("AMPP_TRAIN_TEST_INF_AT=1:0,2:0,3:0,5:0,6:0 ") + AMPP_FAULTS_CLI + " " +
      small_run(tmp.path(), "--nproc 1 --steps 10 --max-consecutive-skips 4 --opt-level O1 --dtype bf16"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the run diverged: 5 of the last 6 steps (to step 6) had inf/NaN gradients"));
  EXPECT_FALSE(fs::exists(tmp.path() / "out" / "model.pt"));
}

// Before: a missing node 0 was reported after twice --timeout, under three LibTorch backtraces.
TEST(TrainReliability, AMissingMasterIsOneLineWithoutBacktraces) {
  ampp_test::TempDir tmp;
  const auto r = run_ampp("run --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-port " +
                          std::to_string(ampp_test::free_port()) + " -- " + AMPP_CLI + " " +
                          small_run(tmp.path(), "--nproc 1 --steps 2 --timeout 2"));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 could not reach the master at 127.0.0.1:"));
  EXPECT_THAT(r.output, Not(HasSubstr("frame #")));
  EXPECT_THAT(r.output, Not(HasSubstr("Exception raised from")));
}

// The fault-injection hooks of the tests are not in the shipped binary: its environment and files
// cannot reach them.
TEST(TrainReliability, TheShippedBinaryHasNoFaultInjection) {
  ampp_test::TempDir tmp;
  const auto r = ampp_test::run_shell(
      std::string("AMPP_TRAIN_TEST_INF_AT=2:0 AMPP_TRAIN_TEST_KILL_AT_STEP=3 AMPP_TRAIN_TEST_KILL_IN_SAVE=1 ") +
      AMPP_CLI + " " + small_run(tmp.path(), "--nproc 1 --steps 4 --log-every 1 --opt-level O1 --dtype bf16"));
  ASSERT_EQ(r.code, 0) << r.output;
  for (const auto& step : records_of_type(tmp.path() / "out" / "metrics.jsonl", "step"))
    EXPECT_FALSE(step["skipped"].get<bool>()) << step.dump();
}

TEST(TrainReliability, MaxConsecutiveSkipsZeroNeverStops) {
  ampp_test::TempDir tmp;
  const auto r = run_ampp(small_run(tmp.path(),
                                    "--nproc 1 --epochs 1 --max-consecutive-skips 0 --opt-level O1 "
                                    "--dtype fp16 --loss-scale 1e30"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(records_of_type(tmp.path() / "out" / "metrics.jsonl", "summary").at(0)["skipped_steps"], 12);
}

// Before: --resume of a finished run wrote test_accuracy 0.0 over the real summary.
TEST(TrainReliability, ResumingAFinishedRunChangesNothing) {
  ampp_test::TempDir tmp;
  const fs::path out = tmp.path() / "out";
  ASSERT_EQ(run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 1")).code, 0);
  const std::string summary = ampp_test::read_file(out / "summary.json"),
                    metrics = ampp_test::read_file(out / "metrics.jsonl");
  const std::string model = ampp_test::read_file(out / "model.pt");
  const auto r = run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 1 --resume"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(ampp_test::read_file(out / "summary.json"), summary);
  EXPECT_EQ(ampp_test::read_file(out / "metrics.jsonl"), metrics);
  EXPECT_EQ(ampp_test::read_file(out / "model.pt"), model);
}

// A worker that died between the last checkpoint and summary.json: the outputs are rebuilt, equal.
TEST(TrainReliability, AFinishedRunWithLostOutputsGetsThemBackFromItsCheckpoint) {
  for (const std::string stop : {"--epochs 1", "--epochs 2 --steps 15"}) {  // epoch end; step limit mid-epoch
    ampp_test::TempDir tmp;
    const fs::path out = tmp.path() / "out";
    ASSERT_EQ(run_ampp(small_run(tmp.path(), "--nproc 1 " + stop)).code, 0);
    const auto before = nlohmann::json::parse(ampp_test::read_file(out / "summary.json"));
    fs::copy_file(out / "model.pt", tmp.path() / "model-before.pt");
    fs::remove(out / "summary.json");
    fs::remove(out / "model.pt");
    const auto r = run_ampp(small_run(tmp.path(), "--nproc 1 --resume " + stop));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto after = nlohmann::json::parse(ampp_test::read_file(out / "summary.json"));
    for (const char* key : {"test_accuracy", "test_loss", "train_loss", "steps", "epochs", "skipped_steps"})
      EXPECT_EQ(after[key], before[key]) << stop << ": " << key;
    EXPECT_GT(after["test_accuracy"].get<double>(), 0.0);
    ampp_test::expect_same_model(tmp.path() / "model-before.pt", out / "model.pt");
  }
}

// Before: a --checkpoint-dir that is a file was reported at the first save, after a whole epoch.
TEST(TrainReliability, UnusableOutputFoldersFailBeforeTraining) {
  ampp_test::TempDir tmp;
  std::ofstream(tmp.path() / "ckpt") << "a file, not a folder";
  for (const std::string nproc : {"--nproc 1", "--nproc 2"}) {
    const auto r = run_ampp(small_run(tmp.path(), nproc + " --epochs 1"));
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr("--checkpoint-dir '" + (tmp.path() / "ckpt").string() + "' is not a folder"));
    EXPECT_FALSE(fs::exists(tmp.path() / "out" / "metrics.jsonl")) << nproc << ": no step was trained";
  }
}

// Before: two runs writing into one --out silently lost one run's metrics.
TEST(TrainReliability, ASecondRunIntoTheSameOutputFolderIsRefused) {
  ampp_test::TempDir tmp;
  fs::create_directories(tmp.path() / "out");
  ampp::FolderLock held((tmp.path() / "out").string(), "test");
  const auto r = run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 1"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--out '" + (tmp.path() / "out").string() + "' is in use by another run (pid " +
                                  std::to_string(::getpid()) + ")"));
}

// Before: a full disk while writing model.pt aborted with a LibTorch backtrace and left a truncated
// model.pt. RLIMIT_FSIZE (ulimit -f, 1 KiB blocks in bash) fails writes past it as a full disk does.
TEST(TrainReliability, AFullDiskKeepsThePreviousModelFileAndSaysSoInOneLine) {
  ampp_test::TempDir tmp;
  const fs::path out = tmp.path() / "out";
  // No checkpoints: the checkpoint (model + momentum) would meet the limit first.
  const std::string flags =
      "train --data synthetic:384 --model cnn --batch-size 32 --deterministic --threads 1 "
      "--quiet --no-plots --nproc 1 --epochs 1 --out " +
      out.string();
  ASSERT_EQ(run_ampp(flags).code, 0);
  const std::string model = ampp_test::read_file(out / "model.pt");
  ASSERT_GT(model.size(), 64u * 1024) << "the limit below must lie between the small files and model.pt";
  const std::string cmd =
      "bash -c \"trap '' XFSZ; ulimit -f 64; exec " + std::string(AMPP_CLI) + " " + flags + " --seed 1\"";
  const auto r = ampp_test::run_shell(cmd);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("writing '" + fs::absolute(out / "model.pt").string() +
                                  "' failed (write): File too large; the previous file, if any, is unchanged"));
  EXPECT_THAT(r.output, Not(HasSubstr("Exception raised from")));
  EXPECT_EQ(ampp_test::read_file(out / "model.pt"), model);
  for (const auto& entry : fs::directory_iterator(out))
    EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr(".tmp"))) << "temporary file left behind";
}

// Before: LibTorch's 16-frame backtrace.
TEST(TrainReliability, ACheckpointWhoseArchiveCannotBeReadIsOneLine) {
  ampp_test::TempDir tmp;
  ampp::train::write_checkpoint_bytes((tmp.path() / "ckpt" / "checkpoint.ampp").string(), "not a zip archive");
  const auto r = run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 1 --resume"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("passed its checksum but the archive inside cannot be read"));
  EXPECT_THAT(r.output, Not(HasSubstr("Exception raised from")));
  EXPECT_THAT(r.output, Not(HasSubstr("frame #")));
}

// Before: the new --loss-scale was silently replaced by the checkpoint's while the summary printed it.
TEST(TrainReliability, ResumingWithAnotherLossScaleIsRefused) {
  ampp_test::TempDir tmp;
  ASSERT_EQ(run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 1 --opt-level O1 --dtype fp16")).code, 0);
  const auto r =
      run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 2 --resume --opt-level O1 --dtype fp16 --loss-scale 128"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("belongs to a different run"));
  EXPECT_THAT(r.output, HasSubstr("loss_scale=128"));
}

// Before: a stopped worker cost 30 minutes, then rank 0 was blamed for a Gloo timeout.
TEST(TrainReliability, AStoppedWorkerIsNamedByTheStallWatch) {
  ampp_test::TempDir tmp;
  const auto r = ampp_test::run_shell("env AMPP_TRAIN_TEST_STOP_AT_STEP=5 " + std::string(AMPP_FAULTS_CLI) + " " +
                                      small_run(tmp.path(), "--nproc 2 --epochs 3 --stall-timeout 3 --timeout 600"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("worker rank 1 (local rank 1, pid ")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("made no progress for ")) << r.output;
  // It stopped after step 5, before reporting it.
  EXPECT_THAT(r.output, HasSubstr("(last reported step 4; the process is stopped (SIGSTOP or SIGTSTP))")) << r.output;
}
