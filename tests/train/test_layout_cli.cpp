// `ampp train --nproc auto` (the default): the layout of workers x threads is measured on this
// machine for this job, once, said on the terminal and cached; a resumed run keeps its checkpoint's.
#include <gtest/gtest.h>

#include <ampp/util/threads.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "ampp_test.h"
#include "train_cli.h"

namespace {

namespace fs = ampp_test::fs;

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

}  // namespace
