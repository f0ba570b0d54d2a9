// `ampp train --tensorboard DIR`: TensorBoard's own reader (the `tensorboard` Python package's
// EventAccumulator, tests/train/tensorboard_read.py) loads the files of a run that was stopped and
// resumed, and returns the values of metrics.jsonl, step for step, as float32 (TensorBoard's
// scalar type); with --doctor, a gradient histogram per parameter at every logged step.
#include <ampp/train/metrics.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include "ampp/train/report_json.h"

#include <filesystem>
#include <fstream>
#include <map>

#include "ampp_test.h"
#include "train_cli.h"

namespace fs = std::filesystem;

namespace {

// TensorBoard tag -> the metrics.jsonl key of the same value, per record type.
const std::map<std::string, std::string> kStepTags = {{"train/loss", "loss"},
                                                      {"train/loss_scale", "loss_scale"},
                                                      {"train/skipped_steps", "skipped_total"},
                                                      {"train/lr", "lr"},
                                                      {"train/images_per_sec", "images_per_sec"}};
const std::map<std::string, std::string> kEpochTags = {{"epoch/train_loss", "train_loss"},
                                                       {"epoch/train_accuracy", "train_accuracy"},
                                                       {"epoch/test_loss", "test_loss"},
                                                       {"epoch/test_accuracy", "test_accuracy"},
                                                       {"epoch/images_per_sec", "images_per_sec"},
                                                       {"epoch/loss_scale", "loss_scale"},
                                                       {"epoch/lr", "lr"}};

// tag -> step -> value, as TensorBoard read it.
using Scalars = std::map<std::string, std::map<int64_t, double>>;

Scalars scalars_of(const nlohmann::json& read) {
  Scalars s;
  for (const auto& [tag, events] : read.at("scalars").items())
    for (const auto& e : events) s[tag][e.at(0).get<int64_t>()] = e.at(1).get<double>();
  return s;
}

// Every value of `record` under `tags` is in TensorBoard at `step`, equal as float32.
void expect_logged(const Scalars& tb, const nlohmann::json& record, int64_t step,
                   const std::map<std::string, std::string>& tags) {
  for (const auto& [tag, key] : tags) {
    ASSERT_TRUE(tb.count(tag)) << "TensorBoard has no tag " << tag;
    ASSERT_TRUE(tb.at(tag).count(step)) << tag << " has no value at step " << step;
    EXPECT_EQ(tb.at(tag).at(step), static_cast<float>(record.at(key).get<double>())) << tag << " at step " << step;
  }
}

}  // namespace

TEST(TensorBoardCli, TensorBoardReadsTheMetricsOfAResumedRun) {
  ampp_test::TempDir tmp;
  const auto tb_dir = tmp.path() / "tb";
  const std::string flags = "--nproc 1 --log-every 1 --doctor --tensorboard " + tb_dir.string();
  auto r = ampp_test::run_ampp(ampp_test::small_run(tmp.path(), flags + " --epochs 1"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = ampp_test::run_ampp(ampp_test::small_run(tmp.path(), flags + " --epochs 2 --resume"));
  ASSERT_EQ(r.code, 0) << r.output;
  if (!fs::exists(AMPP_TENSORBOARD_PYTHON)) GTEST_SKIP() << "no Python with tensorboard: " << AMPP_TENSORBOARD_PYTHON;
  const auto answer = tmp.path() / "read.json";
  r = ampp_test::run_shell(std::string(AMPP_TENSORBOARD_PYTHON) + " " + AMPP_TEST_DIR + "/tensorboard_read.py " +
                           tb_dir.string() + " " + answer.string());
  if (r.code == 3) GTEST_SKIP() << "the tensorboard package is not installed: " << r.output;
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(answer);
  const auto read = nlohmann::json::parse(in);
  EXPECT_EQ(read.at("files"), 2) << "the resumed run adds a file beside the first";
  const Scalars tb = scalars_of(read);
  int64_t steps = 0, epochs = 0;
  for (const auto& record : ampp::train::read_jsonl((tmp.path() / "out" / "metrics.jsonl").string())) {
    const auto type = record.value("type", "");
    if (type == "step") {
      expect_logged(tb, record, record.at("step"), kStepTags);
      ++steps;
    } else if (type == "epoch") {
      expect_logged(tb, record, record.at("steps"), kEpochTags);
      ++epochs;
    }
  }
  EXPECT_EQ(steps, 24);  // 2 epochs of 384 / 32 batches, every step logged
  EXPECT_EQ(epochs, 2);
  EXPECT_EQ(tb.at("train/loss").size(), 24u) << "no value TensorBoard shows is missing from metrics.jsonl";
  // The doctor's histograms: one per parameter per logged step. The last holds the resumed process's
  // 12 steps, as its doctor.json does: the same exponent counts (bins [e, e + 1) of log2 |gradient|).
  const auto& fc2 = read.at("histograms").at("doctor/log2_grad/fc2.weight");
  ASSERT_EQ(fc2.size(), 24u);
  const auto& last = fc2.at(23);
  EXPECT_EQ(last.at(0), 24);
  std::ifstream doctor_in(tmp.path() / "out" / "doctor.json");
  const auto doctor = nlohmann::json::parse(doctor_in);
  for (const auto& p : doctor.at("parameters")) {
    if (p.at("name") != "fc2.weight") continue;
    const auto& bins = p.at("exponents");  // [[exponent, count], ...], lowest first
    double count = 0;
    for (const auto& b : bins) count += b.at(1).get<double>();
    EXPECT_EQ(last.at(1).get<double>(), count);
    EXPECT_EQ(last.at(2).get<double>(), bins.front().at(0).get<double>());
    EXPECT_EQ(last.at(3).get<double>(), bins.back().at(0).get<double>() + 1);
    EXPECT_EQ(last.at(4).get<int>(), bins.back().at(0).get<int>() - bins.front().at(0).get<int>() + 1);
  }
}
