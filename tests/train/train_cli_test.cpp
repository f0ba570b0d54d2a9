// `ampp train` end to end through the built binary: flag validation, metrics.jsonl, exact
// resume (1 and 2 workers), corrupted checkpoints, and recovery under `ampp run --max-restarts`.
#include <ampp/train/checkpoint.h>
#include <ampp/train/metrics.h>
#include <ampp/train/models.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include "ampp/train/report_json.h"

#include <filesystem>
#include <fstream>

#include "ampp_test.h"
#include "train_cli.h"

namespace fs = std::filesystem;
using namespace ampp::train;

namespace {

using ampp_test::expect_same_model;
using ampp_test::run_ampp;
using ampp_test::small_run;

using ampp_test::check_resume_is_exact;

}  // namespace

TEST(TrainCli, InvalidFlagsGiveClearErrors) {
  std::vector<std::pair<std::string, std::string>> cases{
      // Parsed by the library's own parsers; CLI11 puts the flag in front of their messages.
      {"--opt-level O5", "--opt-level: Unexpected optimization level 'O5'. Options are 'O0', 'O1', 'O2', 'O3'"},
      {"--dtype fp4", "--dtype: the value 'fp4' is not a low-precision dtype; use bf16, fp16 or fp8"},
      {"--loss-scale=-3", "--loss-scale: loss_scale must be \"dynamic\" or a finite number > 0, got -3"},
      {"--loss-scale abc", "--loss-scale: loss_scale must be \"dynamic\" or a number"},
      // Checked by ampp::train::validate, which names TrainOptions fields; the CLI shows the flags.
      {"--model vgg", "--model 'vgg' is unknown; choose one of: mlp, cnn, resnet"},
      {"--batch-size 0", "--batch-size must be at least 1"},
      {"--epochs 0", "--epochs must be at least 1"},
      {"--lr=-1", "--lr must be a positive number"},
      {"--momentum 1.5", "--momentum must be in [0, 1)"},
      {"--lr-gamma 0", "--lr-gamma must be in (0, 1]"},
      {"--clip-grad-norm=-1", "--clip-grad-norm must be 0 (off) or a positive"},
      {"--resume", "--resume needs --checkpoint-dir"},
      {"--checkpoint-every 5", "--checkpoint-every needs --checkpoint-dir"},
      {"--lr-step=-1", "--lr-step must be 0 (constant lr) or a positive number of epochs"},
      {"--log-every 0", "--log-every must be at least 1"},
      {"--nproc 0", "--nproc: '0' is not auto or a number of workers from 1 to 256"},
      {"--nproc many", "--nproc: 'many' is not auto or a number of workers from 1 to 256"},
      {"--epochs abc", "--epochs: 'abc' is not an integer"},
      // Numbers too large for the field: before, a crash (uncaught std::out_of_range) or a silent clamp.
      {"--epochs 99999999999999999999", "--epochs: '99999999999999999999' is not an integer in"},
      {"--batch-size 99999999999999999999", "--batch-size: '99999999999999999999' is not an integer in"},
      {"--threads 4294967297", "--threads: '4294967297' is not an integer in -2147483648..2147483647"},
      {"--seed 99999999999999999999", "--seed: '99999999999999999999' is not an integer in 0..9223372036854775807"},
      {"--lr 1e999", "--lr: '1e999' is not a finite number"},
      {"--clip-grad-norm nan", "--clip-grad-norm: 'nan' is not a finite number"},
      {"--stall-timeout 1e300", "--stall-timeout must be 0 (off) to 1e6 seconds"},
      {"--num-classes 1", "--num-classes must be 0 (from the data) or 2 to 100000"},
      {"--max-consecutive-skips=-1", "--max-consecutive-skips must be 0 (never stop) or a positive number"},
      {"--timeout 0", "--timeout must be from 1 to 1e7 seconds, got 0"},
      {"--timeout 1e8", "--timeout must be from 1 to 1e7 seconds, got 1e+08"},
      {"--threads 2000", "--threads must be 0 (automatic) or a count from 1 to 1024, got 2000"},
      {"--warmup-steps=-2", "--warmup-steps must be 0 (off) or a positive number of steps"},
      {"--optimizer adam", "unknown optimizer 'adam': use sgd or adamw"},
      {"--lr-schedule linear", "unknown lr schedule 'linear': use step or cosine"},
      {"--lr-schedule cosine --lr-step 2", "--lr-step is StepLR's, and the schedule is cosine"},
      {"--lr-decay-steps 100", "--lr-decay-steps sets the cosine schedule's length; add --lr-schedule cosine"},
      {"--model gpt-tiny --lr-step 2", "--lr-step is StepLR's, and the schedule is cosine (a GPT's default)"},
      {"--lr-schedule cosine --lr-decay-steps=-1", "--lr-decay-steps must be 0 (to the run's last step)"},
      {"--grad-accum 0", "--grad-accum must be 1 (off) to 4096 micro-batches"},
      {"--dtype fp8", "fp8 products are the GPTs' Linear layers; cnn has none to convert"},
      {"--model gpt-tiny --dtype fp8 --opt-level O0", "--dtype fp8 with O0: fp8 Linear layers beside bf16 run at -O1"},
      {"--model gpt-tiny --fp8-recipe rowwise", "--fp8-recipe chooses the recipe of --dtype fp8; add --dtype fp8"},
      {"--model gpt-tiny --fp8-layers all", "--fp8-layers all chooses the fp8 layers; add --dtype fp8"},
      {"--model gpt-tiny --dtype fp8 --fp8-recipe mxfp8",
       "unknown fp8 recipe 'mxfp8': use tensorwise, rowwise or delayed"},
      {"--model gpt-tiny --dtype fp8 --fp8-amax-history 16",
       "--fp8-amax-history is the delayed recipe's; add --dtype fp8 --fp8-recipe delayed"},
      {"--model gpt-tiny --dtype fp8 --fp8-recipe delayed --fp8-amax-history 0",
       "--fp8-amax-history must be 1 to 1000000 passes, got 0"},
      {"--grad-accum 3", "--grad-accum 3 does not divide --batch-size 128 into equal micro-batches"},
      {"--grad-accum 2 --fsdp", "--grad-accum under FSDP is not built yet"},
      {"--grad-accum 64 --batch-size 64 --nproc 2", "does not divide each worker's batch of 32"},
      {"--data /nonexistent/folder --nproc 1", "dataset folder '/nonexistent/folder' does not exist"},
      {"--device tpu", "--device must be cpu, cuda or cuda:N, got 'tpu'"},
      {"--device cuda:x", "--device must be cpu, cuda or cuda:N, got 'cuda:x'"},
  };
  // Without a GPU (every CI machine here) a CUDA device is refused before any work, saying why.
  if (!torch::cuda::is_available()) cases.push_back({"--device cuda", "no CUDA GPU is visible to this process"});
  ampp_test::expect_train_errors(cases);
}

TEST(TrainCli, MetricsJsonlHasStepEpochAndSummaryRecords) {
  ampp_test::TempDir tmp;
  // 384 images / 32 per batch = 12 steps per epoch; a step line every 5 steps + the epoch's last.
  auto r = run_ampp(small_run(tmp.path(), "--epochs 2 --nproc 1 --log-every 5 --opt-level O1 --dtype fp16"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto lines = read_jsonl((tmp.path() / "out" / "metrics.jsonl").string());
  std::vector<int64_t> steps;
  int epochs = 0, summaries = 0;
  for (const auto& j : lines) {
    const auto type = j.at("type").get<std::string>();
    if (type == "step") {
      steps.push_back(j.at("step").get<int64_t>());
      EXPECT_GT(j.at("loss_scale").get<double>(), 0);
      EXPECT_TRUE(std::isfinite(j.at("loss").get<double>()));
      if (!j.at("skipped").get<bool>()) EXPECT_EQ(steps.back() % 5 == 0 || steps.back() % 12 == 0, true);
    } else if (type == "epoch") {
      ++epochs;
      EXPECT_EQ(j.at("steps").get<int64_t>(), 12 * epochs);
      EXPECT_GE(j.at("test_accuracy").get<double>(), 0);
      EXPECT_LE(j.at("test_accuracy").get<double>(), 100);
    } else if (type == "summary") {
      ++summaries;
      EXPECT_EQ(j.at("steps").get<int64_t>(), 24);
      EXPECT_EQ(j.at("world_size").get<int>(), 1);
    }
  }
  EXPECT_EQ(epochs, 2);
  EXPECT_EQ(summaries, 1);
  for (int64_t s : {5, 10, 12, 15, 20, 24}) EXPECT_NE(std::find(steps.begin(), steps.end(), s), steps.end()) << s;
  EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end()));
  // The synthetic classes are separable: two epochs learn them.
  EXPECT_GT(lines.back().at("test_accuracy").get<double>(), 50.0);
}

TEST(TrainCli, ResumeIsBitIdenticalOneWorker) { check_resume_is_exact("--nproc 1 --opt-level O1 --dtype fp16"); }

TEST(TrainCli, ResumeIsBitIdenticalOneWorkerO2Bf16) { check_resume_is_exact("--nproc 1 --opt-level O2 --dtype bf16"); }

// model.pt loads into a freshly built FP32 model whatever the opt level: under O2-bf16 it holds
// the trained bf16 values widened to FP32 (each exactly representable in bf16), not bf16 tensors.
TEST(TrainCli, O2Bf16ModelFileLoadsIntoAFreshFp32Model) {
  ampp_test::TempDir tmp;
  auto r = run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 1 --opt-level O2 --dtype bf16"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto model = make_model("cnn");
  torch::serialize::InputArchive in;
  in.load_from((tmp.path() / "out" / "model.pt").string());
  model->load(in);
  const auto fresh = make_model("cnn");
  auto before = fresh->named_parameters();
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor& w = item.value();
    ASSERT_EQ(w.scalar_type(), torch::kFloat) << item.key();
    EXPECT_TRUE(torch::isfinite(w).all().item<bool>()) << item.key();
    EXPECT_FALSE(torch::equal(w, before[item.key()])) << item.key() << " was not trained";
    const bool is_bn = item.key().rfind("bn", 0) == 0;  // BatchNorm stays FP32 under O2
    if (!is_bn) EXPECT_TRUE(torch::equal(w, w.to(torch::kBFloat16).to(torch::kFloat))) << item.key();
  }
}

TEST(TrainCli, ResumeIsBitIdenticalTwoWorkers) { check_resume_is_exact("--nproc 2 --opt-level O1 --dtype fp16"); }

TEST(TrainCli, MidEpochResumeIsBitIdentical) {
  ampp_test::TempDir straight, split;
  const std::string flags = "--nproc 1 --epochs 1 --opt-level O2 --dtype fp16 --lr-step 1";
  ASSERT_EQ(run_ampp(small_run(straight.path(), flags)).code, 0);
  auto r = run_ampp(small_run(split.path(), flags + " --steps 5"));  // stops mid-epoch, checkpoint at step 5
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_ampp(small_run(split.path(), flags + " --resume"));
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_model(straight.path() / "out" / "model.pt", split.path() / "out" / "model.pt");
}

// Warmup counts optimizer steps taken: the step skipped for an (injected) inf loss does not advance
// it, so the next step uses the same warmup lr. (PyTorch: "Detected call of lr_scheduler.step() before
// optimizer.step()" when a GradScaler skips, and a schedule that runs ahead of the optimizer.)
// Gradient accumulation: four micro-batches of 8 make the step of the batch of 32, to rounding (the mlp,
// which has no BatchNorm, whose statistics are per micro-batch), with fp16's scaler (the micro-batches'
// gradients stay scaled until the last) and over two workers (one allreduce per step) at O2. Four steps:
// far from the synthetic data's near-zero loss, where relative rounding would dominate.
TEST(TrainCli, GradAccumTrainsAsTheWholeBatch) {
  for (const std::string flags :
       {"--nproc 1 --opt-level O0", "--nproc 1 --opt-level O1 --dtype fp16", "--nproc 2 --opt-level O2 --dtype bf16"}) {
    SCOPED_TRACE(flags);
    ampp_test::TempDir tmp;
    const auto run = [&](const std::string& name, const std::string& extra) {
      const auto r = run_ampp(
          "train --data synthetic:512 --model mlp --batch-size 32 --steps 4 --epochs 1 "
          "--deterministic "
          "--threads 1 --quiet --no-plots --out " +
          (tmp.path() / name).string() + " " + flags + extra);
      EXPECT_EQ(r.code, 0) << r.output;
      return nlohmann::json::parse(std::ifstream(tmp.path() / name / "summary.json"));
    };
    const auto whole = run("whole", ""), accumulated = run("accumulated", " --grad-accum 4");
    EXPECT_EQ(accumulated.at("steps"), whole.at("steps"));
    for (const char* loss : {"train_loss", "test_loss"}) {
      const double want = whole.at(loss).get<double>();
      EXPECT_NEAR(accumulated.at(loss).get<double>(), want, 1e-3 * want) << loss;
    }
    const double other = run("other", " --lr 0.2").at("test_loss").get<double>();
    EXPECT_GT(std::abs(other - whole.at("test_loss").get<double>()), 1e-2)
        << "a comparison that can fail: another lr trains another model";
  }
}

TEST(TrainCli, GradAccumResumesBitIdenticallyTwoWorkers) {
  check_resume_is_exact("--nproc 2 --opt-level O1 --dtype fp16 --grad-accum 2");
}

TEST(TrainCli, WarmupCountsOnlyTheStepsTaken) {
  ampp_test::TempDir tmp;
  const auto r = ampp_test::run_shell(
      std::string("AMPP_TRAIN_TEST_INF_AT=2:0 ") + AMPP_FAULTS_CLI + " " +
      small_run(tmp.path(), "--nproc 1 --steps 7 --log-every 1 --lr 0.1 --warmup-steps 4 --opt-level O1 --dtype bf16"));
  ASSERT_EQ(r.code, 0) << r.output;
  int64_t taken = 0, records = 0;
  for (const auto& j : ampp::train::read_jsonl((tmp.path() / "out" / "metrics.jsonl").string())) {
    if (j.value("type", "") != "step") continue;
    ++records;
    const double want = taken < 4 ? 0.1 * (static_cast<double>(taken + 1) / 4.0) : 0.1;
    EXPECT_EQ(j["lr"].get<double>(), want) << j.dump();
    EXPECT_EQ(j["skipped"].get<bool>(), j["step"] == 2) << j.dump();
    if (!j["skipped"].get<bool>()) ++taken;
  }
  EXPECT_EQ(records, 7);
  EXPECT_EQ(taken, 6);
}

// The schedule is a function of (epoch, steps taken), both in the checkpoint: a run stopped in the
// middle of its warmup, with a skipped step before the stop, resumes to the same model bit for bit.
TEST(TrainCli, ResumeInTheMiddleOfTheWarmupIsBitIdentical) {
  ampp_test::TempDir straight, split;
  const std::string env = std::string("AMPP_TRAIN_TEST_INF_AT=3:0 ") + AMPP_FAULTS_CLI + " ";
  const std::string flags = "--nproc 1 --epochs 1 --opt-level O1 --dtype fp16 --warmup-steps 9";
  ASSERT_EQ(ampp_test::run_shell(env + small_run(straight.path(), flags)).code, 0);
  auto r = ampp_test::run_shell(env + small_run(split.path(), flags + " --steps 5"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = ampp_test::run_shell(env + small_run(split.path(), flags + " --resume"));
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_model(straight.path() / "out" / "model.pt", split.path() / "out" / "model.pt");
}

TEST(TrainCli, CorruptedOrForeignCheckpointIsAClearErrorOnResume) {
  ampp_test::TempDir tmp;
  ASSERT_EQ(run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 1")).code, 0);
  const fs::path ckpt = tmp.path() / "ckpt" / "checkpoint.ampp";
  ASSERT_TRUE(fs::exists(ckpt));
  // Different flags: refused with the reason.
  auto r = run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 2 --resume --opt-level O2"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("belongs to a different run"), std::string::npos) << r.output;
  // Truncated.
  fs::resize_file(ckpt, fs::file_size(ckpt) / 2);
  r = run_ampp(small_run(tmp.path(), "--nproc 1 --epochs 2 --resume"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("is truncated"), std::string::npos) << r.output;
}

TEST(TrainCli, KilledWorkerUnderMaxRestartsRecoversToTheSameParameters) {
  ampp_test::TempDir straight, killed;
  const std::string flags = "--epochs 2 --checkpoint-every 4 --opt-level O1 --dtype fp16";
  auto r = run_ampp("run --nproc-per-node 2 -- " + std::string(AMPP_CLI) + " " + small_run(straight.path(), flags));
  ASSERT_EQ(r.code, 0) << r.output;
  // AMPP_TRAIN_TEST_KILL_AT_STEP makes rank 1 SIGKILL itself at that step in the first attempt only.
  r = run_ampp("run --nproc-per-node 2 --max-restarts 1 -- env AMPP_TRAIN_TEST_KILL_AT_STEP=18 " +
               std::string(AMPP_FAULTS_CLI) + " " + small_run(killed.path(), flags));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("restarting the worker group"), std::string::npos) << r.output;  // it really was killed
  expect_same_model(straight.path() / "out" / "model.pt", killed.path() / "out" / "model.pt");
}
