// `ampp train` writes checkpoint.pt next to checkpoint.ampp: Python PyTorch opens it with plain
// torch.load, loads it strictly into the same network written in torch.nn (tests/train/pytorch_cnn.py),
// restores SGD and GradScaler from it, and computes the same logits as ampp's own model.pt, bit for bit.
#include <ampp/amp/pytorch_checkpoint.h>
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
