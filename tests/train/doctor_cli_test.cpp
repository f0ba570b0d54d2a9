// `ampp doctor` and `ampp train --doctor`: the report files, what they hold, and the recommendation for
// a healthy run and for a run made to diverge with a far too high learning rate.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "ampp_test.h"
#include "train_cli.h"

namespace fs = std::filesystem;
using ampp_test::run_ampp;
using ::testing::HasSubstr;

namespace {

const char* kSmall = "--data synthetic:384 --model cnn --batch-size 32 --threads 1 --quiet --nproc 1 ";

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

bool is_png(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  return in && std::string(magic + 1, 3) == "PNG";
}

}  // namespace

TEST(DoctorCli, ReportsTheGradientRangesOfEveryParameterAtEveryStep) {
  ampp_test::TempDir tmp;
  const auto out = tmp.path() / "doctor";
  const auto r = run_ampp(std::string("doctor ") + kSmall + "--steps 6 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = read_json(out / "doctor.json");
  EXPECT_EQ(j.at("steps"), 6);
  std::vector<std::string> names;
  int64_t elements = 0;
  for (const auto& p : j.at("parameters")) {
    names.push_back(p.at("name"));
    elements += p.at("at_used_scales").at("fp16").at("elements").get<int64_t>();
    EXPECT_FALSE(p.at("exponents").empty()) << p.at("name");
  }
  EXPECT_THAT(names, ::testing::Contains("fc2.weight"));
  EXPECT_THAT(names, ::testing::Contains("bn1.bias"));
  // Every element of every gradient, once per step.
  EXPECT_EQ(j.at("total").at("at_used_scales").at("fp16").at("elements").get<int64_t>(), elements);
  EXPECT_EQ(elements % 6, 0);
  // A healthy fp16 run: fp16 fits at a power-of-two scale; nothing says to lower the learning rate.
  const auto& advice = j.at("recommendation");
  EXPECT_EQ(advice.at("dtype"), "fp16");
  EXPECT_FALSE(advice.at("lower_learning_rate").get<bool>());
  const double scale = advice.at("init_scale");
  EXPECT_EQ(std::exp2(std::round(std::log2(scale))), scale);
  EXPECT_TRUE(is_png(out / "doctor_gradients.png"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("warning")));
}

// The worked example in small: a far too high learning rate. The doctor runs every step
// (no divergence stop) and says it is the learning rate, not the loss scale or the format.
TEST(DoctorCli, ADivergingRunIsDiagnosedAsALearningRateProblem) {
  ampp_test::TempDir tmp;
  const auto out = tmp.path() / "doctor";
  const auto r = run_ampp(std::string("doctor ") + kSmall + "--lr 1e4 --steps 30 --no-plots --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = read_json(out / "doctor.json");
  EXPECT_EQ(j.at("steps"), 30);
  EXPECT_GT(j.at("steps_with_non_finite_gradients").get<int64_t>(), 0);
  EXPECT_TRUE(j.at("recommendation").at("lower_learning_rate").get<bool>());
  EXPECT_FALSE(fs::exists(out / "doctor_gradients.png"));
  // A diagnosis is the result; non-finite weights are never saved (the test loss is NaN here).
  EXPECT_FALSE(fs::exists(out / "model.pt"));
}

// ampp train --doctor writes the report also when the run stops for divergence.
TEST(DoctorCli, TrainWithDoctorWritesTheReportWhenTheRunDiverges) {
  ampp_test::TempDir tmp;
  const auto r = run_ampp(ampp_test::small_run(tmp.path(), "--nproc 1 --doctor --lr 1e4 --max-consecutive-skips 5"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the run diverged"));
  const auto j = read_json(tmp.path() / "out" / "doctor.json");
  EXPECT_GE(j.at("steps_with_non_finite_gradients").get<int64_t>(), 5);
}

// Two workers: rank 0 alone writes the report (DDP's averaged gradients are the same on every rank).
TEST(DoctorCli, TwoWorkersWriteOneReport) {
  ampp_test::TempDir tmp;
  const auto out = tmp.path() / "doctor";
  const auto r = run_ampp(std::string("doctor --data synthetic:384 --model mlp --batch-size 32 --threads 1 --quiet "
                                      "--nproc 2 --steps 4 --no-plots --out ") +
                          out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_json(out / "doctor.json").at("steps"), 4);
}

// The first skipped step is replayed under the NonFiniteLocator: a static scale of 2^40 overflows fp16
// in the backward at step 1, and the op is named; an injected inf (multiplied into the loss, not part of
// the replayed computation) replays finite, which the report says rather than inventing an origin.
TEST(DoctorCli, TheFirstSkippedStepIsReplayedToFindWhereTheInfWasBorn) {
  ampp_test::TempDir tmp;
  const auto scaled = tmp.path() / "scaled", injected = tmp.path() / "injected";
  auto r = run_ampp(std::string("doctor ") + kSmall + "--steps 3 --no-plots --loss-scale 1099511627776 --out " +
                    scaled.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto found = read_json(scaled / "doctor.json").at("first_non_finite");
  EXPECT_EQ(found.at("step"), 1);
  EXPECT_THAT(found.at("origin").get<std::string>(), HasSubstr("Backward")) << found.dump();
  EXPECT_THAT(found.at("origin").get<std::string>(), HasSubstr("Half")) << found.dump();
  r = ampp_test::run_shell("AMPP_TRAIN_TEST_INF_AT=2:0 " + std::string(AMPP_FAULTS_CLI) + " doctor " + kSmall +
                           "--steps 3 --no-plots --out " + injected.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto none = read_json(injected / "doctor.json").at("first_non_finite");
  EXPECT_EQ(none.at("step"), 2);
  EXPECT_TRUE(none.at("origin").is_null()) << none.dump();
  EXPECT_THAT(none.at("note").get<std::string>(), HasSubstr("replayed finite"));
}
