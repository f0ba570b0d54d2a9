// How `ampp train` lays out and measures its workers: `--nproc auto` (the default) measures the layout of
// workers x threads on this machine for this job, once, says it and caches it, and a resumed run keeps its
// checkpoint's; every rank's step time split into disjoint phases (summary.json always, the terminal with
// --profile: they add up to no more than the training time, and one process never waits for an
// allreduce); workers on one machine reduce through shared memory (default) or Gloo (`--gloo-allreduce`),
// and two workers' sums are the same bits either way (a+b is commutative), so the same model.pt.
#include <gtest/gtest.h>

#include <ampp/train/metrics.h>
#include <ampp/util/threads.h>
#include <nlohmann/json.hpp>
#include "ampp/train/report_json.h"

#include <fstream>
#include <string>

#include "ampp_test.h"
#include "idx_files.h"
#include "train_cli.h"

namespace {

namespace fs = ampp_test::fs;
using ampp::train::StepPhase;

// A small job without --quiet (the choice is said on the terminal) and with its own cache folder.
ampp_test::Result train_auto(const fs::path& dir, const fs::path& cache, const std::string& extra) {
  return ampp_test::run_shell("XDG_CACHE_HOME=" + cache.string() + " " + AMPP_CLI +
                              " train --data synthetic:384 --batch-size 32 --threads 1 --no-plots --out " +
                              (dir / "out").string() + " --checkpoint-dir " + (dir / "ckpt").string() + " " + extra);
}

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file);
  return nlohmann::json::parse(in);
}

TEST(LayoutCli, AutoMeasuresEveryLayoutOnceSaysWhichWonAndReusesTheMeasurement) {
  if (ampp::usable_cores() < 2) GTEST_SKIP() << "one core: there is only one layout";
  ampp_test::TempDir tmp;
  const fs::path cache = tmp.path() / "cache", file = cache / "ampp" / "layouts.json";
  auto r = train_auto(tmp.path() / "first", cache, "--steps 3 --model cnn");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("measured now, cached in " + file.string()), std::string::npos) << r.output;
  const auto measured = read_json(file);
  ASSERT_EQ(measured.size(), 1u) << measured.dump();
  const auto rates = measured.begin().value();
  EXPECT_TRUE(rates.contains("1") && rates.contains("2")) << rates.dump();  // 1 x 1 and 2 x 1 on 2+ cores
  for (const auto& [nproc, rate] : rates.items()) EXPECT_GT(rate.get<double>(), 0.0) << nproc;
  const std::string winner = rates["1"].get<double>() >= rates["2"].get<double>() ? "1 worker x" : "2 workers x";
  EXPECT_NE(r.output.find("ampp train: " + winner), std::string::npos) << r.output;

  r = train_auto(tmp.path() / "second", cache, "--steps 3 --model cnn");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("measuring"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("measured earlier"), std::string::npos) << r.output;

  std::ofstream(file) << "{ not json";  // a damaged cache is measured again, not an error
  r = train_auto(tmp.path() / "third", cache, "--steps 3 --model mlp");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("measured now"), std::string::npos) << r.output;
  r = train_auto(tmp.path() / "quiet", cache, "--steps 3 --model mlp --opt-level O0 --quiet");  // a new job
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("ampp train:"), std::string::npos) << "--quiet measures without a word\n" << r.output;
  EXPECT_EQ(read_json(file).size(), 2u) << "the cache gained the new job";

  // Valid JSON with impossible entries (0 workers, a rate that is a string) is measured again too.
  auto edited = read_json(file);
  for (auto& [job, job_rates] : edited.items()) job_rates = {{"0", 1e9}, {"2", "fast"}};
  std::ofstream(file) << edited.dump();
  r = train_auto(tmp.path() / "edited", cache, "--steps 3 --model mlp");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("measured now"), std::string::npos) << r.output;
}

TEST(LayoutCli, AResumedRunKeepsTheWorkerCountOfItsCheckpoint) {
  ampp_test::TempDir tmp;
  const fs::path cache = tmp.path() / "cache";
  ASSERT_EQ(train_auto(tmp.path(), cache, "--nproc 2 --steps 3 --quiet").code, 0);
  const auto r = train_auto(tmp.path(), cache, "--steps 6 --resume");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 workers x 1 thread: as the checkpoint being resumed"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(cache / "ampp" / "layouts.json")) << "nothing to measure when resuming";
}

ampp::train::Summary summary_of(const fs::path& out) {
  std::ifstream in(out / "summary.json");
  return ampp::train::summary_from_json(nlohmann::json::parse(in));
}

void expect_phases_cover_the_steps(const ampp::train::Summary& s, int64_t steps) {
  ASSERT_EQ(s.step_phases.size(), static_cast<size_t>(s.world_size));
  for (const auto& p : s.step_phases) {
    EXPECT_EQ(p.steps, steps);
    for (double seconds : p.seconds) EXPECT_GE(seconds, 0.0);
    for (StepPhase work : {StepPhase::kData, StepPhase::kForward, StepPhase::kBackward, StepPhase::kOptimizer})
      EXPECT_GT(p[work], 0.0) << ampp::train::step_phase_name(work);
    // Evaluation and start-up are not step time; the steps are most of a short run all the same.
    EXPECT_LE(p.total_seconds(), s.seconds);
    EXPECT_GT(p.total_seconds(), 0.2 * s.seconds);
  }
}

TEST(ProfileCli, OneWorkerHasNoAllreduceWaitAndPrintsItsPhases) {
  ampp_test::TempDir tmp;
  const auto r = ampp_test::run_ampp(ampp_test::small_run(tmp.path(), "--nproc 1 --steps 12 --profile"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("where the step time went"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("allreduce_wait"), std::string::npos) << r.output;
  const auto s = summary_of(tmp.path() / "out");
  expect_phases_cover_the_steps(s, 12);
  EXPECT_EQ(s.step_phases[0][StepPhase::kAllreduceWait], 0.0);
  // LibTorch's profiler over steps 4-12 (the epoch's end closes the window: 12 steps of 32 of 384 images).
  EXPECT_NE(r.output.find("the operators of steps 4-12 on rank 0"), std::string::npos) << r.output;
  ASSERT_TRUE(s.ops.has_value());
  EXPECT_EQ(s.ops->steps, 9);
  double self_sum = 0;
  bool convolution = false, backward_node = false;
  for (const auto& op : s.ops->ops) {
    EXPECT_GT(op.calls, 0) << op.name;
    EXPECT_GE(op.self_ms, 0.0) << op.name;
    EXPECT_GE(op.total_ms, op.self_ms - 1e-9) << op.name;
    self_sum += op.self_ms;
    convolution |= op.name == "aten::convolution";
    backward_node |= op.name == "ConvolutionBackward0";
  }
  EXPECT_TRUE(convolution && backward_node) << r.output;  // forward ops and autograd's nodes are both seen
  // One thread: the operators' own times cannot add up to more than the window (5% for timer rounding).
  EXPECT_LE(self_sum, 1.05 * s.ops->recorded_ms);
  EXPECT_GT(self_sum, 0.2 * s.ops->recorded_ms);  // the steps are mostly operators
  for (size_t i = 1; i < s.ops->ops.size(); ++i) EXPECT_GE(s.ops->ops[i - 1].self_ms, s.ops->ops[i].self_ms);
}

// The memory report counts the MLP's bytes exactly: 784-256-128-10 has 235,146 parameters, FP32 at O0; at
// O2 bf16 copies in the model and FP32 masters the optimizer steps, with its momentum on the masters; O2's
// gradients between steps are the FP32 buffers the masters' gradients are converted into (the .grads are
// dropped after the step, as apex does).
TEST(ProfileCli, MemoryReportCountsWeightsMastersAndStateExactly) {
  constexpr int64_t kParams = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10;
  struct Case {
    std::string flags;
    int64_t weights, masters, gradients;
  };
  for (const Case& c : {Case{"--opt-level O0", 4 * kParams, 0, 4 * kParams},
                        Case{"--opt-level O2 --dtype bf16", 2 * kParams, 4 * kParams, 4 * kParams}}) {
    ampp_test::TempDir tmp;
    const auto r = ampp_test::run_ampp(
        "train --model mlp --data synthetic:384 --batch-size 32 --nproc 1 --threads 1 "
        "--steps 4 --quiet --no-plots --profile --out " +
        (tmp.path() / "out").string() + " --checkpoint-dir " + (tmp.path() / "ckpt").string() + " " + c.flags);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("FP32 masters"), std::string::npos) << r.output;
    const auto s = summary_of(tmp.path() / "out");
    ASSERT_TRUE(s.memory.has_value()) << c.flags;
    const auto& m = *s.memory;
    EXPECT_EQ(m.weights, c.weights) << c.flags;
    EXPECT_EQ(m.masters, c.masters) << c.flags;
    EXPECT_EQ(m.optimizer_state, 4 * kParams) << c.flags;  // SGD momentum, FP32, on what the optimizer steps
    EXPECT_EQ(m.gradients, c.gradients) << c.flags;
    EXPECT_GE(m.data, 384 * (784 * 4 + 8)) << c.flags;  // the training split: float32 pixels, int64 labels
    const int64_t named = m.weights + m.masters + m.gradients + m.optimizer_state + m.data;
    EXPECT_GE(m.tensors_at_rest, named) << c.flags;  // every named tensor was counted by the tracker
    EXPECT_GT(m.activations_and_temporaries(), 0) << c.flags;
    EXPECT_GT(m.outside_tensors(), 0) << c.flags;
  }
}

// Images mapped from a plain IDX folder are resident file pages, not data in memory; --data-in-memory
// holds them as tensors again. Exact bytes: 320 images of 28x28 uint8, 320 int64 labels.
TEST(ProfileCli, MappedImagesAreReportedApartFromTheDataInMemory) {
  constexpr int64_t kImages = 256 + 64, kPixels = kImages * 28 * 28, kLabels = kImages * 8;
  ampp_test::TempDir tmp;
  fs::create_directories(tmp.path() / "data");
  ampp_test::write_mnist_folder(tmp.path() / "data", 256, 64, 28, 28, /*gzip=*/false);
  for (const std::string mode : {"mapped", "in memory"}) {
    const fs::path out = tmp.path() / (mode == "mapped" ? "mapped" : "in-memory");
    const auto r = ampp_test::run_ampp(
        "train --model mlp --batch-size 32 --nproc 1 --threads 1 --steps 4 --quiet "
        "--no-plots --profile --data " +
        (tmp.path() / "data").string() + " --out " + out.string() + (mode == "mapped" ? "" : " --data-in-memory"));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto s = summary_of(out);
    ASSERT_TRUE(s.memory.has_value()) << mode;
    if (mode == "mapped") {
      EXPECT_THAT(s.data, ::testing::HasSubstr("images mapped from " + (tmp.path() / "data").string()));
      EXPECT_EQ(s.memory->data, kLabels);
      EXPECT_GT(s.memory->mapped_data, 0);
      EXPECT_LE(s.memory->mapped_data, kPixels + 4 * 4096);  // two files' headers and partial pages
      EXPECT_GE(s.memory->file_backed, s.memory->mapped_data);
    } else {
      EXPECT_THAT(s.data, ::testing::HasSubstr("images in memory"));
      EXPECT_EQ(s.memory->data, kLabels + kPixels);
      EXPECT_EQ(s.memory->mapped_data, 0);
    }
  }
}

TEST(ProfileCli, TwoWorkersReportEachRanksPhasesWithoutBeingAsked) {
  ampp_test::TempDir tmp;
  const auto r = ampp_test::run_ampp(ampp_test::small_run(tmp.path(), "--nproc 2 --steps 12"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("where the step time went"), std::string::npos) << r.output;
  const auto s = summary_of(tmp.path() / "out");
  EXPECT_FALSE(s.memory.has_value());  // counting every tensor is for --profile only
  EXPECT_FALSE(s.ops.has_value());     // and so is LibTorch's profiler
  expect_phases_cover_the_steps(s, 12);
  // Both ranks' rows arrived (not rank 0's twice): their totals are measured separately.
  EXPECT_NE(s.step_phases[0].total_seconds(), s.step_phases[1].total_seconds());
}

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

// Two launchers, as on two machines (AMPP_MACHINE_ID tells ampp they are), each with two workers: the
// workers of each reduce through shared memory and one per machine through Gloo. The sums are in another
// order than one machine's (rank order), so the model is the same to rounding (~1e-9 here), not bit for bit.
TEST(AllreduceCli, TwoMachinesOfTwoWorkersTrainLikeOneMachineOfFour) {
  ampp_test::TempDir tmp;
  const std::string train = std::string(AMPP_CLI) +
                            " train --data synthetic:384 --model cnn --batch-size 32 --steps 6 --deterministic "
                            "--threads 1 --no-plots --out ";
  auto r = ampp_test::run_shell(train + (tmp.path() / "one" / "out").string() + " --nproc 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("DDP: 4 workers on this machine reduce through shared memory"), std::string::npos)
      << r.output;
  const std::string port = std::to_string(ampp_test::free_port());
  auto node = [&](int k) {
    return "AMPP_MACHINE_ID=node" + std::to_string(k) + " " + AMPP_CLI + " run --nnodes 2 --node-rank " +
           std::to_string(k) + " --nproc-per-node 2 --master-port " + port + " -q -- " + train +
           (tmp.path() / "two" / "out").string();
  };
  const auto node1_log = (tmp.path() / "node1.log").string();
  r = ampp_test::run_shell("{ " + node(1) + " > " + node1_log + " 2>&1 & } ; " + node(0) + "; code=$?; wait $!; " +
                           "c1=$?; cat " + node1_log + "; [ $code = 0 ] && [ $c1 = 0 ]");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("DDP: 4 workers on 2 machines reduce through shared memory within each machine"),
            std::string::npos)
      << r.output;
  ampp_test::expect_same_model(tmp.path() / "one" / "out" / "model.pt", tmp.path() / "two" / "out" / "model.pt", 1e-6);
}

}  // namespace

// --fsdp changes what the fastest layout is (collectives per unit, not per bucket), so it is part of the
// job's key: the same job with and without it is measured and cached as two jobs.
TEST(LayoutCli, FsdpIsMeasuredAsAJobOfItsOwn) {
  if (ampp::usable_cores() < 2) GTEST_SKIP() << "one core: there is only one layout";
  ampp_test::TempDir tmp;
  const fs::path cache = tmp.path() / "cache", file = cache / "ampp" / "layouts.json";
  const auto run = [&](const std::string& name, const std::string& extra) {
    return ampp_test::run_shell("XDG_CACHE_HOME=" + cache.string() + " " + AMPP_CLI +
                                " train --data synthetic:384 --batch-size 32 --threads 1 --no-plots --steps 3 "
                                "--model cnn --quiet --out " +
                                (tmp.path() / name).string() + " " + extra);
  };
  ASSERT_EQ(run("ddp", "").code, 0);
  const auto r = run("fsdp", "--fsdp");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto jobs = read_json(file);
  ASSERT_EQ(jobs.size(), 2u) << jobs.dump();
  int with_fsdp = 0;
  for (const auto& [key, rates] : jobs.items()) with_fsdp += key.find(" fsdp=1") != std::string::npos;
  EXPECT_EQ(with_fsdp, 1) << jobs.dump();
}

// The GPU defaults (cuDNN benchmark mode, FusedSGD, pinned and prefetched batches) are ignored on the CPU: turning them
// off there trains the same model, bit for bit.
TEST(GpuDefaultsCli, OnTheCpuTheirFlagsChangeNothing) {
  ampp_test::TempDir tmp;
  for (const std::string dir : {"defaults", "off"}) {
    const std::string extra =
        dir == "off" ? "--no-cudnn-benchmark --no-fused-optimizer --no-pinned-batches --no-prefetch --device cpu " : "";
    const auto r =
        ampp_test::run_ampp(ampp_test::small_run(tmp.path() / dir, "--nproc 1 --steps 6 --opt-level O1 " + extra));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  ampp_test::expect_same_model(tmp.path() / "defaults" / "out" / "model.pt", tmp.path() / "off" / "out" / "model.pt");
}

// The batches' loader thread (a GPU default; --prefetch turns it on on the CPU) hands the step the same
// batches: two workers trained with it, stopped mid-epoch (step 9 of 12) and resumed, end with the model of
// a run without it, bit for bit.
TEST(GpuDefaultsCli, PrefetchedBatchesTrainTheSameModelAndResumeExactly) {
  ampp_test::TempDir tmp;
  auto train = [&](const std::string& dir, const std::string& env, const std::string& extra) {
    const auto r = ampp_test::run_shell(env + AMPP_FAULTS_CLI + " " +
                                        ampp_test::small_run(tmp.path() / dir, "--epochs 2 --opt-level O1 " + extra));
    ASSERT_EQ(r.code, 0) << r.output;
  };
  train("plain", "", "");
  train("prefetched", "", "--prefetch --steps 9");
  train("prefetched", "", "--prefetch --resume");
  ampp_test::expect_same_model(tmp.path() / "plain" / "out" / "model.pt",
                               tmp.path() / "prefetched" / "out" / "model.pt");
}
