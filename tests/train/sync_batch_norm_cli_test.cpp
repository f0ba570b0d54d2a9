// `ampp train --sync-bn`: two DDP workers with SyncBatchNorm take the step one worker takes on the
// whole global batch; without it their BatchNorm sees only each worker's half (so they do not).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <string>

#include "ampp_test.h"
#include "train_cli.h"

namespace {

using ampp_test::run_ampp;
using ampp_test::small_run;

std::map<std::string, torch::Tensor> model_tensors(const ampp_test::fs::path& file) {
  torch::serialize::InputArchive in;
  in.load_from(file.string());
  std::map<std::string, torch::Tensor> tensors;
  ampp_test::collect_tensors(in, "", tensors);
  return tensors;
}

// The names of the tensors of `b` that are not within fp32 reassociation of `a`'s.
std::string tensors_that_differ(const std::map<std::string, torch::Tensor>& a,
                                const std::map<std::string, torch::Tensor>& b) {
  std::string names;
  for (const auto& [key, tensor] : a) {
    if (!torch::allclose(tensor.to(torch::kDouble), b.at(key).to(torch::kDouble), 1e-4, 1e-6)) names += key + " ";
  }
  return names;
}

// One step (O0, fp32): the two workers' batches together are the one worker's batch (the
// DistributedSampler deals the same permutation out in turn), and DDP averages their mean losses'
// gradients into the whole batch's. Only BatchNorm's statistics can tell the runs apart.
TEST(SyncBatchNormCli, TwoWorkersTakeTheStepOneWorkerTakesOnTheWholeBatch) {
  ampp_test::TempDir one, synced, plain;
  const std::string step = "--steps 1 --opt-level O0 ";
  auto r = run_ampp(small_run(one.path(), step + "--nproc 1"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_ampp(small_run(synced.path(), step + "--nproc 2 --sync-bn"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_ampp(small_run(plain.path(), step + "--nproc 2"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto reference = model_tensors(one.path() / "out" / "model.pt");
  ASSERT_GE(reference.size(), 14u);
  EXPECT_EQ(tensors_that_differ(reference, model_tensors(synced.path() / "out" / "model.pt")), "");
  const std::string unsynced = tensors_that_differ(reference, model_tensors(plain.path() / "out" / "model.pt"));
  EXPECT_NE(unsynced.find("bn1.running_var"), std::string::npos) << unsynced;
  EXPECT_NE(unsynced.find("conv1.weight"), std::string::npos) << unsynced;
}

// The doctor replays the first skipped step on rank 0 alone; SyncBatchNorm must not wait there for
// rank 1 (a collective rank 1 never joins: without LocalBatchNormGuard this fails after --timeout).
TEST(SyncBatchNormCli, TheDoctorsReplayOnRankZeroAloneDoesNotWaitForTheOtherWorker) {
  ampp_test::TempDir tmp;
  const auto out = tmp.path() / "doctor";
  const auto r = run_ampp(
      "doctor --data synthetic:384 --model cnn --batch-size 32 --threads 1 --quiet --nproc 2 --sync-bn --steps 3 "
      "--no-plots --timeout 20 --loss-scale 1099511627776 --out " +
      out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(out / "doctor.json");
  const auto report = nlohmann::json::parse(in);
  const auto& found = report.at("first_non_finite");
  EXPECT_EQ(found.at("step"), 1) << found.dump();
  EXPECT_TRUE(found.at("origin").is_string()) << found.dump();
}

TEST(SyncBatchNormCli, TheMlpHasNoBatchNormToSynchronise) {
  ampp_test::TempDir dir;
  const auto r =
      run_ampp("train --data synthetic:64 --model mlp --sync-bn --quiet --out " + (dir.path() / "out").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--sync-bn: mlp has no BatchNorm to synchronise"), std::string::npos) << r.output;
}

}  // namespace
