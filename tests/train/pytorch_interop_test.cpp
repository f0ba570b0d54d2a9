// `ampp train` writes checkpoint.pt next to checkpoint.ampp: Python PyTorch opens it with plain
// torch.load, loads it strictly into the same network written in torch.nn (tests/train/pytorch_cnn.py),
// restores SGD and GradScaler from it, and computes the same logits as ampp's own model.pt, bit for bit.
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/train/models.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ampp_test.h"
#include "train_cli.h"

namespace fs = std::filesystem;

TEST(PyTorchInterop, TrainWritesACheckpointPlainTorchLoadOpens) {
  ampp_test::TempDir tmp;
  auto r = ampp_test::run_ampp(ampp_test::small_run(tmp.path(), "--nproc 1 --epochs 1"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto pt = tmp.path() / "ckpt" / "checkpoint.pt", answer = tmp.path() / "python.json";
  ASSERT_TRUE(fs::exists(pt));
  r = ampp_test::run_shell(std::string(AMPP_PYTHON) + " " + AMPP_TEST_DIR + "/pytorch_cnn.py " + pt.string() + " " +
                           answer.string());
  if (r.code == 3) GTEST_SKIP() << "no usable Python torch: " << r.output;
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(answer);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("epoch"), 1);
  EXPECT_EQ(j.at("step"), 12);       // 384 images / 32 per batch
  EXPECT_EQ(j.at("momentum"), 0.9);  // the file's, not the 0.5 the script built SGD with
  EXPECT_EQ(j.at("buffers"), 10);    // a momentum buffer per parameter
  // ampp's own model.pt, in ampp's network, on the same input, one thread as the script.
  torch::set_num_threads(1);
  auto model = ampp::train::make_model("cnn");
  torch::serialize::InputArchive archive;
  archive.load_from((tmp.path() / "out" / "model.pt").string());
  model->load(archive);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(torch::linspace(-1, 1, 4 * 784).reshape({4, 1, 28, 28})).flatten();
  ASSERT_EQ(j.at("logits").size(), static_cast<size_t>(logits.numel()));
  for (int64_t i = 0; i < logits.numel(); ++i)
    EXPECT_EQ(std::strtod(j.at("logits")[i].get<std::string>().c_str(), nullptr), logits[i].item<double>()) << i;
  // And ampp reads its own file back: the same weights as model.pt.
  const auto state = ampp::load_pytorch(pt.string()).toGenericDict().at("model").toGenericDict();
  for (const auto& p : model->named_parameters())
    EXPECT_TRUE(torch::equal(state.at(p.key()).toTensor(), p.value())) << p.key();
}

// ---- one run handed between Python and ampp (examples/python/train_cnn.py is the Python half) ----

namespace {

// 384 synthetic images in batches of 32: 12 steps per epoch; fp32 with a dynamic loss scale on both
// sides (ampp's O0, Python's GradScaler at fp32), so both compute the same bits.
const char* kHandoffData = "--data synthetic:384 --batch-size 32";

ampp_test::Result run_python_half(const std::string& args) {
  return ampp_test::run_shell(std::string(AMPP_PYTHON) + " " + AMPP_EXAMPLES_DIR + "/python/train_cnn.py " +
                              kHandoffData + " " + args);
}

std::string ampp_half(const fs::path& dir, const std::string& args) {
  return ampp_test::small_run(dir, std::string("--nproc 1 --opt-level O0 --loss-scale dynamic ") + args);
}

// The Python half needs torch.amp.GradScaler("cpu") (PyTorch 2.3+; Debian 12's 1.13 has none).
bool python_torch_missing(std::string& why) {
  const auto r = ampp_test::run_shell(std::string(AMPP_PYTHON) + " -c 'import torch; torch.amp.GradScaler'");
  why = r.output;
  return r.code != 0;
}

// Two training dicts hold the same run: position, every weight and buffer, every momentum buffer and
// the loss scale, bit for bit.
void expect_same_run(const fs::path& a, const fs::path& b) {
  const auto da = ampp::load_pytorch(a.string()).toGenericDict(), db = ampp::load_pytorch(b.string()).toGenericDict();
  for (const char* key : {"epoch", "batch", "step"}) EXPECT_EQ(da.at(key).toInt(), db.at(key).toInt()) << key;
  const auto ma = da.at("model").toGenericDict(), mb = db.at("model").toGenericDict();
  ASSERT_EQ(ma.size(), mb.size());
  for (const auto& item : ma) {
    const auto& name = item.key().toStringRef();
    EXPECT_TRUE(torch::equal(item.value().toTensor(), mb.at(name).toTensor())) << name;
  }
  const auto sa = da.at("optimizer").toGenericDict().at("state").toGenericDict();
  const auto sb = db.at("optimizer").toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(sa.size(), 10u);  // a momentum buffer per parameter
  for (const auto& item : sa) {
    const auto buf = [](const c10::IValue& s) { return s.toGenericDict().at("momentum_buffer").toTensor(); };
    EXPECT_TRUE(torch::equal(buf(item.value()), buf(sb.at(item.key())))) << "momentum buffer " << item.key();
  }
  const auto ca = da.at("scaler").toGenericDict(), cb = db.at("scaler").toGenericDict();
  EXPECT_EQ(ca.at("scale").toDouble(), cb.at("scale").toDouble());
  EXPECT_EQ(ca.at("_growth_tracker").toInt(), cb.at("_growth_tracker").toInt());
}

}  // namespace

TEST(PyTorchInterop, ARunStartedInPythonContinuesInAmppAsInPython) {
  std::string why;
  if (python_torch_missing(why)) GTEST_SKIP() << "no usable Python torch: " << why;
  ampp_test::TempDir tmp;
  const auto py5 = tmp.path() / "py5.pt", py16 = tmp.path() / "py16.pt";
  auto r = run_python_half("--steps 5 --save " + py5.string());
  ASSERT_EQ(r.code, 0) << r.output;
  // ampp continues from Python's file across the epoch boundary (step 12) to step 16 ...
  r = ampp_test::run_ampp(ampp_half(tmp.path(), "--steps 16 --resume-from " + py5.string()));
  ASSERT_EQ(r.code, 0) << r.output;
  // ... and Python, from its own file, takes the same 11 steps.
  r = run_python_half("--steps 16 --resume-from " + py5.string() + " --save " + py16.string());
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_run(tmp.path() / "ckpt" / "checkpoint.pt", py16);
}

TEST(PyTorchInterop, ARunStartedInAmppContinuesInPythonAsInAmpp) {
  std::string why;
  if (python_torch_missing(why)) GTEST_SKIP() << "no usable Python torch: " << why;
  ampp_test::TempDir tmp;
  auto r = ampp_test::run_ampp(ampp_half(tmp.path(), "--steps 5"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ampp5 = tmp.path() / "ampp5.pt", py16 = tmp.path() / "py16.pt";
  fs::copy_file(tmp.path() / "ckpt" / "checkpoint.pt", ampp5);
  r = run_python_half("--steps 16 --resume-from " + ampp5.string() + " --save " + py16.string());
  ASSERT_EQ(r.code, 0) << r.output;
  r = ampp_test::run_ampp(ampp_half(tmp.path(), "--steps 16 --resume"));  // ampp from its own checkpoint
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_run(tmp.path() / "ckpt" / "checkpoint.pt", py16);
}

TEST(PyTorchInterop, ResumeFromABareStateDictStartsFromItsWeights) {
  ampp_test::TempDir tmp;
  // The seed 000 loop saves model.module.state_dict() alone: ampp starts a run from those weights.
  auto model = ampp::train::make_model("cnn");
  for (auto& p : model->parameters()) p.data().fill_(0.01);
  ampp::save_pytorch(ampp::module_state_dict(*model), (tmp.path() / "weights.pt").string());
  auto r =
      ampp_test::run_ampp(ampp_half(tmp.path(), "--steps 1 --resume-from " + (tmp.path() / "weights.pt").string()));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto saved = ampp::load_pytorch((tmp.path() / "ckpt" / "checkpoint.pt").string()).toGenericDict();
  EXPECT_EQ(saved.at("step").toInt(), 1);  // a fresh position
  // One SGD step from 0.01 everywhere: fc1.bias moved off 0.01 but stays near it.
  const auto bias = saved.at("model").toGenericDict().at("fc1.bias").toTensor();
  EXPECT_LT((bias - 0.01).abs().max().item<double>(), 0.01);
  EXPECT_GT((bias - 0.01).abs().max().item<double>(), 0.0);
}

TEST(PyTorchInterop, ResumeFromAFileOfAnotherModelNamesTheKeys) {
  ampp_test::TempDir tmp;
  auto mlp = ampp::train::make_model("mlp");
  ampp::save_pytorch(ampp::module_state_dict(*mlp), (tmp.path() / "mlp.pt").string());
  const auto r =
      ampp_test::run_ampp(ampp_half(tmp.path(), "--steps 1 --resume-from " + (tmp.path() / "mlp.pt").string()));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("Missing key(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("conv1.weight"), std::string::npos) << r.output;
}

TEST(PyTorchInterop, ResumeFromWithOtherSgdSettingsSaysWhichFlagsToPass) {
  std::string why;
  if (python_torch_missing(why)) GTEST_SKIP() << "no usable Python torch: " << why;
  ampp_test::TempDir tmp;
  const auto py = tmp.path() / "py.pt";
  auto r = run_python_half("--steps 1 --momentum 0.5 --save " + py.string());
  ASSERT_EQ(r.code, 0) << r.output;
  r = ampp_test::run_ampp(ampp_half(tmp.path(), "--steps 2 --resume-from " + py.string()));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--momentum 0.5"), std::string::npos) << r.output;
}

// ampp's own checkpoint.pt continues a run exactly as its checkpoint.ampp does: under O2 the masters
// come from the file's float32 values (the bf16 model is their rounding), with DDP every worker loads it.
class ResumeFromOwnFile : public ::testing::TestWithParam<const char*> {};

TEST_P(ResumeFromOwnFile, ContinuesBitForBitAsResume) {
  ampp_test::TempDir tmp;
  const std::string flags = std::string(GetParam()) + " ";
  auto run = [&](const std::string& dir, const std::string& extra) {
    return ampp_test::run_ampp(ampp_test::small_run(tmp.path() / dir, flags + extra));
  };
  auto r = run("a", "--steps 5");
  ASSERT_EQ(r.code, 0) << r.output;
  fs::create_directories(tmp.path() / "b");
  fs::copy_file(tmp.path() / "a" / "ckpt" / "checkpoint.pt", tmp.path() / "b" / "start.pt");
  r = run("a", "--steps 16 --resume");  // from checkpoint.ampp
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("b", "--steps 16 --resume-from " + (tmp.path() / "b" / "start.pt").string());
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_run(tmp.path() / "a" / "ckpt" / "checkpoint.pt", tmp.path() / "b" / "ckpt" / "checkpoint.pt");
}

INSTANTIATE_TEST_SUITE_P(OptLevels, ResumeFromOwnFile,
                         ::testing::Values("--nproc 1 --opt-level O2 --dtype bf16 --loss-scale dynamic",
                                           "--nproc 2 --opt-level O1 --dtype fp16"));
