// `ampp train --profile`: every rank's step time split into disjoint phases, in summary.json always
// and on the terminal when asked. The phases cover the step loop: they add up to no more than the
// training time, and a single process never waits for an allreduce.
#include <gtest/gtest.h>

#include <ampp/train/metrics.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "ampp_test.h"
#include "train_cli.h"

namespace {

namespace fs = ampp_test::fs;
using ampp::train::StepPhase;

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
}

TEST(ProfileCli, TwoWorkersReportEachRanksPhasesWithoutBeingAsked) {
  ampp_test::TempDir tmp;
  const auto r = ampp_test::run_ampp(ampp_test::small_run(tmp.path(), "--nproc 2 --steps 12"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("where the step time went"), std::string::npos) << r.output;
  const auto s = summary_of(tmp.path() / "out");
  expect_phases_cover_the_steps(s, 12);
  // Both ranks' rows arrived (not rank 0's twice): their totals are measured separately.
  EXPECT_NE(s.step_phases[0].total_seconds(), s.step_phases[1].total_seconds());
}

}  // namespace
