// metrics.jsonl records, the progress bar's plain-line mode, the summary table and the plots.
#include <ampp/train/metrics.h>
#include <ampp/util/threads.h>
#include "ampp/train/report_json.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "ampp_test.h"

namespace fs = std::filesystem;
using namespace ampp::train;

TEST(Metrics, JsonlRecordsRoundTripAndAppend) {
  ampp_test::TempDir tmp;
  const auto path = (tmp.path() / "m" / "metrics.jsonl").string();
  {
    MetricsWriter w(path, /*append=*/false);
    StepRecord s;
    s.step = 3, s.loss = 0.5, s.loss_scale = 32768, s.skipped = true, s.skipped_total = 1;
    w.write(s);
  }
  {
    MetricsWriter w(path, /*append=*/true);
    EpochRecord e;
    e.epoch = 0, e.test_accuracy = 87.5, e.steps = 10;
    w.write(e);
  }
  auto lines = read_jsonl(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["type"], "step");
  EXPECT_EQ(lines[0]["step"], 3);
  EXPECT_EQ(lines[0]["loss_scale"], 32768.0);
  EXPECT_EQ(lines[0]["skipped"], true);
  EXPECT_EQ(lines[1]["type"], "epoch");
  EXPECT_EQ(lines[1]["test_accuracy"], 87.5);
  MetricsWriter(path, /*append=*/false);  // a fresh run truncates
  EXPECT_TRUE(read_jsonl(path).empty());
}

// A full disk used to cut metrics.jsonl off mid-record with exit 0. /dev/full fails every write
// with ENOSPC, as a full disk does.
TEST(Metrics, AFailedWriteIsAnErrorNamingTheFile) {
  MetricsWriter writer("/dev/full", /*append=*/true);
  AMPP_EXPECT_THROW_WITH(writer.write(StepRecord{}), "writing '/dev/full' failed: No space left on device");
}

TEST(Metrics, SummaryRoundTripsThroughJson) {
  Summary s;
  s.model = "cnn";
  s.precision = "O1 fp16";
  s.world_size = 2;
  s.steps = 42;
  s.test_accuracy = 90.25;
  s.final_scale = 16384;
  const Summary back = summary_from_json(to_json(s));
  EXPECT_EQ(to_json(back), to_json(s));
  AMPP_EXPECT_THROW_WITH(summary_from_json(to_json(StepRecord{})), "not a summary record");
}

TEST(Metrics, StepPhasesRoundTripPerRankAndOlderSummariesHaveNone) {
  using ampp::train::StepPhase;
  Summary s;
  s.world_size = 2;
  s.step_phases.resize(2);
  s.step_phases[0].steps = s.step_phases[1].steps = 8;
  s.step_phases[0][StepPhase::kForward] = 0.5;  // 62.5 ms per step
  s.step_phases[1][StepPhase::kAllreduceWait] = 0.25;
  const auto j = to_json(s);
  EXPECT_DOUBLE_EQ(j["step_phases_ms"][0]["forward"].get<double>(), 62.5);
  EXPECT_DOUBLE_EQ(j["step_phases_ms"][1]["step"].get<double>(), 31.25);
  const Summary back = summary_from_json(j);
  ASSERT_EQ(back.step_phases.size(), 2u);
  EXPECT_DOUBLE_EQ(back.step_phases[1][StepPhase::kAllreduceWait], 0.25);
  auto older = j;
  older.erase("step_phases_ms");
  EXPECT_TRUE(summary_from_json(older).step_phases.empty());
  const std::string table = ampp::train::step_phases_table(s.step_phases);
  EXPECT_NE(table.find("62.50 (100.0%)"), std::string::npos) << table;
  EXPECT_NE(table.find("rank 1"), std::string::npos) << table;
}

TEST(Metrics, MalformedJsonlNamesTheLine) {
  ampp_test::TempDir tmp;
  const auto path = tmp.path() / "bad.jsonl";
  std::ofstream(path) << "{\"a\":1}\n{oops\n";
  AMPP_EXPECT_THROW_WITH(read_jsonl(path.string()), "bad.jsonl:2");
}

TEST(Metrics, PlainProgressPrintsAboutTenLinesPerEpoch) {
  ampp_test::TempDir tmp;
  const auto path = tmp.path() / "progress.txt";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ProgressBar bar(0, 3, 100, /*is_tty=*/false, f);
  for (int s = 1; s <= 100; ++s) bar.update(s, 1234.0, 0.25, 65536, 2);
  bar.finish("done");
  std::fclose(f);
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 11u);  // steps 10, 20, ..., 100 and the tail
  EXPECT_NE(lines[0].find("epoch 1/3"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("step 10/100"), std::string::npos);
  EXPECT_NE(lines[0].find("1234 img/s"), std::string::npos);
  EXPECT_NE(lines[0].find("scale 65536"), std::string::npos);
  EXPECT_NE(lines[0].find("skipped 2"), std::string::npos);
  EXPECT_NE(lines[0].find("ETA"), std::string::npos);
  EXPECT_EQ(lines[0].find('\r'), std::string::npos);  // no terminal control in plain mode
  EXPECT_EQ(lines.back(), "done");
}

TEST(Metrics, SummaryTableHasEveryField) {
  Summary s;
  s.test_accuracy = 88.123, s.seconds = 100.5, s.images_per_sec = 2345, s.skipped_steps = 7, s.final_scale = 4096;
  s.peak_rss_mb = 321, s.compute = "LibTorch: 3 threads; BLAS: X";
  const auto t = summary_table(s);
  for (const char* needle :
       {"88.12 %", "100.5 s", "2345 images/s", "| skipped steps", "4096", "321 MiB", "LibTorch: 3 threads; BLAS: X"})
    EXPECT_NE(t.find(needle), std::string::npos) << needle << "\n" << t;
  EXPECT_GT(peak_rss_mb(), 1.0);
}

TEST(Metrics, ComputeThreadsNameTheBlasAndTheThreadCount) {
  ampp::set_compute_threads(1);
  const std::string d = ampp::describe_compute_threads();
  EXPECT_NE(d.find("LibTorch: 1 threads"), std::string::npos) << d;
  // The wheel's BLAS is MKL; Debian's LibTorch uses OpenBLAS (its pool sized to the same 1 thread).
  if (at::hasMKL())
    EXPECT_NE(d.find("MKL"), std::string::npos) << d;
  else
    EXPECT_NE(d.find("own pool: 1 threads"), std::string::npos) << d;
}

TEST(Metrics, PlotsArePngFiles) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot not installed";
  ampp_test::TempDir tmp;
  const auto path = (tmp.path() / "metrics.jsonl").string();
  {
    MetricsWriter w(path, false);
    for (int step = 1; step <= 40; ++step) {
      StepRecord s;
      s.step = step, s.loss = 1.0 / step, s.skipped = step < 4, s.loss_scale = step < 4 ? 65536.0 / (1 << step) : 8192;
      s.images_per_sec = 1000 + step;
      w.write(s);
    }
    for (int e = 0; e < 2; ++e) {
      EpochRecord r;
      r.epoch = e, r.train_loss = 1.0 / (e + 1), r.test_loss = 1.1 / (e + 1), r.train_accuracy = 80 + e,
      r.test_accuracy = 79 + e;
      w.write(r);
    }
  }
  const auto pngs = write_plots(path, tmp.path().string());
  ASSERT_EQ(pngs.size(), 3u);
  for (const auto& p : pngs) {
    std::ifstream in(p, std::ios::binary);
    char sig[8] = {};
    in.read(sig, 8);
    EXPECT_EQ(std::string(sig + 1, 3), "PNG") << p;
    EXPECT_GT(fs::file_size(p), 5000u) << p;
  }
  // The data gnuplot drew: every record, in order, with the values written above.
  auto rows = [&](const std::string& name) {
    std::ifstream in(tmp.path() / "plot_data" / name);
    std::vector<std::vector<double>> out;
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream fields(line);
      out.emplace_back(std::istream_iterator<double>(fields), std::istream_iterator<double>());
    }
    return out;
  };
  const auto epochs = rows("epochs.dat");
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_EQ(epochs[1], (std::vector<double>{2, 0.5, 0.55, 81, 80}));  // epoch, losses, accuracies
  const auto steps = rows("steps.dat");
  ASSERT_EQ(steps.size(), 40u);
  EXPECT_EQ(steps[9], (std::vector<double>{10, 8192, 1010, 0.1}));  // step, scale, images/s, loss
  const auto skipped = rows("skipped.dat");
  ASSERT_EQ(skipped.size(), 3u);  // steps 1-3, each at the scale after its backoff
  EXPECT_EQ(skipped[2], (std::vector<double>{3, 8192}));
}
