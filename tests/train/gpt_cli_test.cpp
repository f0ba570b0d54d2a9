// `ampp train --model gpt-*` end to end: it learns text (below the unigram baseline), resumes bit for bit,
// writes a checkpoint.pt that loads strictly into the Python twin, and refuses mismatched models and data.
// With --optimizer adamw and --lr-schedule cosine it trains as nanoGPT does: its schedule, its AdamW groups
// (checked by loading the checkpoint's optimizer state into nanoGPT's AdamW in Python).
#include <ampp/precision/float8.h>
#include <ampp/train/metrics.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "ampp_test.h"
#include "train_cli.h"

namespace fs = std::filesystem;

namespace {

using ampp_test::run_ampp;

// Seeded "sentences" of 40 words: learnable structure (spelling, spaces) that token frequencies miss.
fs::path write_text(const fs::path& dir, size_t bytes) {
  static const char* const words[] = {"the",  "cat",   "sat",   "on",    "mat",  "and",  "dog",  "ran",
                                      "far",  "away",  "from",  "a",     "big",  "red",  "barn", "in",
                                      "rain", "while", "birds", "sang",  "loud", "over", "hill", "sun",
                                      "set",  "slow",  "night", "came",  "soft", "wind", "blew", "cold",
                                      "deep", "river", "ran",   "under", "old",  "oak",  "tree", "quiet"};
  std::mt19937 rng(5);
  std::string text;
  while (text.size() < bytes) {
    text += words[rng() % 40];
    text += rng() % 8 == 0 ? ".\n" : " ";
  }
  const fs::path path = dir / "text.txt";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string gpt_run(const fs::path& dir, const std::string& extra) {
  return "train --model gpt-tiny --data text:" + write_text(dir, 24000).string() +
         " --context 32 --n-embd 64 --batch-size 32 --deterministic --threads 1 --quiet --no-plots --out " +
         (dir / "out").string() + " --checkpoint-dir " + (dir / "ckpt").string() + " " + extra;
}

// Trains with `flags`, then opens its checkpoint.pt in Python (pytorch_gpt.py): what that printed, or a skip
// where no Python torch is usable.
std::string python_reads_checkpoint_of(const fs::path& dir, const std::string& flags) {
  auto r = run_ampp(gpt_run(dir, flags));
  EXPECT_EQ(r.code, 0) << r.output;
  r = ampp_test::run_shell(std::string(AMPP_PYTHON) + " " + AMPP_TEST_DIR + "/pytorch_gpt.py " +
                           (dir / "ckpt" / "checkpoint.pt").string());
  if (r.code == 3) return "skip: no usable Python torch: " + r.output;
  EXPECT_EQ(r.code, 0) << r.output;
  return r.output;
}

nlohmann::json gpt_summary_json(const fs::path& dir) {
  return nlohmann::json::parse(std::ifstream(dir / "out" / "summary.json"));
}

}  // namespace

TEST(GptCli, LearnsTextBelowTheUnigramBaseline) {
  ampp_test::TempDir tmp;
  auto r = run_ampp(gpt_run(tmp.path(), "--nproc 1 --epochs 10 --opt-level O1 --dtype bf16"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto s = gpt_summary_json(tmp.path());
  const double unigram = s.at("unigram_loss").get<double>(), loss = s.at("test_loss").get<double>();
  EXPECT_GT(unigram, 2.0);  // about 2.9 nats: 27 letters and space, unevenly used
  EXPECT_LT(loss, unigram - 0.5) << "unigram " << unigram;
  EXPECT_GT(s.at("tokens_per_sec").get<double>(), 0);
}

// With a GPT's defaults (nanoGPT's AdamW, cosine and clipping); the cosine's length given, as the first half
// runs with --epochs 1.
TEST(GptCli, ResumeIsBitIdenticalTwoWorkersO2) {
  ampp_test::check_resume_is_exact("--nproc 2 --opt-level O2 --dtype bf16 --lr-decay-steps 40", gpt_run);
}

TEST(GptCli, CheckpointLoadsStrictlyIntoThePythonModel) {
  ampp_test::TempDir tmp;
  const auto out = python_reads_checkpoint_of(tmp.path(), "--nproc 1 --steps 4 --opt-level O1 --dtype bf16");
  if (out.rfind("skip: ", 0) == 0) GTEST_SKIP() << out;
  EXPECT_NE(out.find("loaded 28 tensors, step 4"), std::string::npos) << out;
}

// nanoGPT's get_lr, written from its train.py: linear warmup (ampp's: lr * (k + 1) / warmup for the k-th step
// taken), then min_lr + (lr - min_lr) * (1 + cos(pi * ratio)) / 2 with min_lr = lr / 10 and ratio the
// fraction of the steps after the warmup (here: to the run's last step).
TEST(GptCli, AdamWWithTheCosineScheduleFollowsNanoGptsLearningRates) {
  ampp_test::TempDir tmp;
  const std::string flags =
      "--nproc 1 --steps 12 --log-every 1 --opt-level O1 --dtype bf16 --optimizer adamw "
      "--weight-decay 0.1 --lr 0.002 --lr-schedule cosine --warmup-steps 4";
  auto r = run_ampp(gpt_run(tmp.path(), flags));
  ASSERT_EQ(r.code, 0) << r.output;
  const double lr = 0.002, min_lr = lr / 10;
  int64_t seen = 0;
  for (const auto& j : ampp::train::read_jsonl((tmp.path() / "out" / "metrics.jsonl").string())) {
    if (j.value("type", "") != "step") continue;
    const int64_t k = j["step"].get<int64_t>() - 1;  // steps taken before this one (bf16: none skipped)
    const double ratio = static_cast<double>(k - 4) / static_cast<double>(12 - 4);
    const double want =
        k < 4 ? lr * static_cast<double>(k + 1) / 4 : min_lr + (lr - min_lr) * 0.5 * (1 + std::cos(M_PI * ratio));
    EXPECT_NEAR(j["lr"].get<double>(), want, 1e-15) << j.dump();
    ++seen;
  }
  EXPECT_EQ(seen, 12);
}

// AdamW's moments are sharded by --zero and gathered into the checkpoint; the cosine position is the
// steps taken, which the checkpoint holds. Its length is given: the first half runs with --epochs 1.
TEST(GptCli, AdamWWithZeroAndTheCosineScheduleResumesBitIdentically) {
  ampp_test::check_resume_is_exact(
      "--nproc 2 --zero --opt-level O2 --dtype bf16 --optimizer adamw --weight-decay 0.1 --lr 0.002 "
      "--lr-schedule cosine --warmup-steps 3 --lr-decay-steps 40",
      gpt_run);
}

// Without --lr-decay-steps the cosine spans the run: one continued with more epochs would follow another
// curve than its first steps did, so the resume is refused, naming the length that continues the first.
TEST(GptCli, TheCosineOverTheRunRefusesAResumeThatChangesItsLength) {
  ampp_test::TempDir tmp;
  const std::string flags = "--nproc 1 --opt-level O1 --dtype bf16 --optimizer adamw --lr-schedule cosine";
  auto r = run_ampp(gpt_run(tmp.path(), "--epochs 1 " + flags));
  ASSERT_EQ(r.code, 0) << r.output;
  const int64_t epoch_steps = gpt_summary_json(tmp.path()).at("steps").get<int64_t>();  // the first run's length
  r = run_ampp(gpt_run(tmp.path(), "--epochs 2 --resume " + flags));
  EXPECT_NE(r.code, 0);
  const std::string first_length =
      fmt::format("a run whose cosine schedule decays over {} steps, and this one's would decay over {}", epoch_steps,
                  2 * epoch_steps);
  EXPECT_NE(r.output.find(first_length), std::string::npos) << r.output;
  const std::string fix = fmt::format("set --lr-decay-steps to {} to continue on its curve", epoch_steps);
  EXPECT_NE(r.output.find(fix), std::string::npos) << r.output;
  r = run_ampp(gpt_run(tmp.path(), fmt::format("--epochs 2 --resume --lr-decay-steps {} ", epoch_steps) + flags));
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST(GptCli, AdamWStateLoadsIntoNanoGptsOptimizerInPython) {
  ampp_test::TempDir tmp;
  const auto out = python_reads_checkpoint_of(
      tmp.path(), "--nproc 1 --steps 4 --opt-level O2 --dtype bf16 --optimizer adamw --weight-decay 0.1");
  if (out.rfind("skip: ", 0) == 0) GTEST_SKIP() << out;
  EXPECT_NE(out.find("loaded 28 tensors, step 4"), std::string::npos) << out;
  // nanoGPT's groups: 10 matrices (embeddings, attention and MLP weights) with decay 0.1, 18 without.
  EXPECT_NE(out.find("adamw: groups of 10 and 18 tensors, weight decay 0.1 and 0, step 4, stepped once more"),
            std::string::npos)
      << out;
}

// The other way: nanoGPT's optimizer in Python takes a step from ampp's state and saves both; ampp continues
// from that file with AdamW's moments and step counts, and its own checkpoint then counts on from Python's.
TEST(GptCli, AdamWStateFromPythonContinuesInAmpp) {
  ampp_test::TempDir first, second;
  const std::string flags = "--nproc 1 --opt-level O2 --dtype bf16 --lr-decay-steps 10";
  auto out = python_reads_checkpoint_of(first.path(), flags + " --steps 4");
  if (out.rfind("skip: ", 0) == 0) GTEST_SKIP() << out;
  const auto from_python = first.path() / "python.pt";
  auto r = ampp_test::run_shell(std::string(AMPP_PYTHON) + " " + AMPP_TEST_DIR + "/pytorch_gpt.py " +
                                (first.path() / "ckpt" / "checkpoint.pt").string() + " " + from_python.string());
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_NE(r.output.find("saved step 5"), std::string::npos) << r.output;
  out = python_reads_checkpoint_of(second.path(), flags + " --steps 7 --resume-from " + from_python.string());
  EXPECT_NE(out.find("loaded 28 tensors, step 7"), std::string::npos) << out;
  EXPECT_NE(out.find("weight decay 0.1 and 0, step 7, stepped once more"), std::string::npos) << out;
}

// --dtype fp8: every Linear of the GPT (all 8: --fp8-layers all, as gpt-tiny's are too small for torchao's
// filter) with fp8 products, both recipes; it learns as bf16 does (validation loss within 2% after 4
// epochs), resumes bit for bit over two workers, and its checkpoint (a Linear's names) loads into the
// Python twin.
TEST(GptCli, Fp8TrainsResumesAndLoadsIntoPython) {
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  auto test_loss = [](const std::string& flags) {
    ampp_test::TempDir tmp;
    const auto r = run_ampp(gpt_run(tmp.path(), "--nproc 1 --epochs 4 " + flags));
    EXPECT_EQ(r.code, 0) << r.output;
    return gpt_summary_json(tmp.path());
  };
  const double bf16 = test_loss("--dtype bf16").at("test_loss").get<double>();
  EXPECT_LT(bf16, 4.0);  // from ln(256) = 5.55 at the start
  for (const std::string recipe : {"tensorwise", "rowwise", "delayed"}) {
    SCOPED_TRACE(recipe);
    const auto s = test_loss("--dtype fp8 --fp8-layers all --fp8-recipe " + recipe);
    EXPECT_NE(s.at("precision").get<std::string>().find("fp8 " + recipe + " in 8 of 8 Linear layers"),
              std::string::npos)
        << s.dump();
    EXPECT_NEAR(s.at("test_loss").get<double>(), bf16, 0.02 * bf16);
  }
  ampp_test::check_resume_is_exact("--nproc 2 --dtype fp8 --fp8-layers all --lr-decay-steps 40", gpt_run);
  ampp_test::TempDir tmp;
  const auto out = python_reads_checkpoint_of(tmp.path(), "--nproc 1 --steps 4 --dtype fp8 --fp8-layers all");
  if (out.rfind("skip: ", 0) == 0) GTEST_SKIP() << out;
  EXPECT_NE(out.find("loaded 28 tensors, step 4"), std::string::npos) << out;
}

// The delayed recipe's state (each layer's amax history and scales, float32 buffers, also at O2's bf16
// model) is part of the checkpoint: two workers (their amaxes reduced to the max each step) resume it bit for
// bit, and the Python twin loads the 16 buffers beside the 28 parameters.
TEST(GptCli, Fp8DelayedStateResumesAndLoadsIntoPython) {
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  const std::string delayed = " --dtype fp8 --fp8-layers all --fp8-recipe delayed --fp8-amax-history 4";
  ampp_test::check_resume_is_exact("--nproc 2 --opt-level O2 --lr-decay-steps 40" + delayed, gpt_run);
  ampp_test::TempDir tmp;
  const auto out = python_reads_checkpoint_of(tmp.path(), "--nproc 1 --steps 4" + delayed);
  if (out.rfind("skip: ", 0) == 0) GTEST_SKIP() << out;
  EXPECT_NE(out.find("loaded 44 tensors, step 4"), std::string::npos) << out;
}

// The doctor under --dtype fp8: per layer and tensor, each training pass's casts (not the evaluation's),
// the range used (tensorwise: its amax maps onto e4m3's largest value) and what saturated or flushed.
TEST(GptCli, TheDoctorReportsEachFp8TensorsRange) {
  if (!ampp::float8_supported()) GTEST_SKIP() << "float8 needs LibTorch 2.6 or newer";
  ampp_test::TempDir tmp;
  auto command = gpt_run(tmp.path(), "--nproc 1 --steps 5 --doctor --dtype fp8 --fp8-layers all");
  command.erase(command.find(" --quiet"), 8);  // the doctor's lines on the terminal
  const auto r = run_ampp(command);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("doctor: fp8: no value saturated"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("doctor: fp8: most flushed to zero: h."), std::string::npos) << r.output;
  const auto report = nlohmann::json::parse(std::ifstream(tmp.path() / "out" / "doctor.json")).at("fp8");
  ASSERT_EQ(report.at("tensors").size(), 24U) << report.dump();  // 8 layers x (input, weight, gradient)
  EXPECT_TRUE(report.at("first_saturated").is_null());
  for (const auto& t : report.at("tensors")) {
    EXPECT_EQ(t.at("casts").get<int64_t>(), 5) << t.dump();
    EXPECT_EQ(t.at("format").get<std::string>(), t.at("tensor") == "gradient" ? "e5m2" : "e4m3") << t.dump();
    EXPECT_NEAR(t.at("max_range_used").get<double>(), 1.0, 1e-6) << t.dump();
    EXPECT_EQ(t.at("saturated").get<double>(), 0.0) << t.dump();
    EXPECT_GE(t.at("flushed_to_zero").get<double>(), 0.0) << t.dump();
  }
}

TEST(GptCli, ModelsAndDataMustMatch) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"--model gpt-tiny --data synthetic", "--data 'synthetic' holds images, which the GPTs cannot read"},
      {"--model cnn --data text", "--data 'text' is text, which only the GPTs read"},
      {"--model cnn --context 16", "--context sets a GPT's size, but the model is cnn"},
      {"--model gpt-tiny --n-head=-1", "--n-head must be 0 (the preset's) or a positive size up to 1000000"},
      {"--model gpt-tiny --sync-bn", "--sync-bn: gpt-tiny has no BatchNorm to synchronise"},
      {"--model gpt-tiny --data text:/nonexistent --nproc 1", "text '/nonexistent' does not exist"},
  };
  ampp_test::expect_train_errors(cases);
}
