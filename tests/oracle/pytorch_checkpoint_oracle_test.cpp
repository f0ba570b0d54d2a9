// PyTorch-format checkpoints against Python PyTorch: a file ampp writes opens with plain torch.load and
// loads into torch.nn / torch.optim / GradScaler; a file Python's torch.save writes (a module's
// state_dict() is an OrderedDict) loads into LibTorch and ampp. Both sides then train the same batches
// and every weight is compared: bit for bit with SGD (the same kernels in the same order), within
// float32 rounding with Adam (PyTorch updates exp_avg with lerp_, LibTorch with mul_ and add_).
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/scaling/grad_scaler.h>
#if AMPP_ORACLE_HAS_TRAIN
#include <ampp/train/save.h>
#endif
#include <gmock/gmock.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>

#include "ampp_test.h"
#include "oracle.h"

namespace ampp_test {
namespace {

using ampp_oracle::json;
using ::testing::HasSubstr;

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::ReLU(),
                               torch::nn::Linear(3, 2));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, torch::nn::Sequential& model,
                                                        double lr) {
  if (kind == "sgd")
    return std::make_unique<torch::optim::SGD>(model->parameters(),
                                               torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(1e-4));
  return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(lr).weight_decay(1e-4));
}

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> batches(int n, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back({torch::randn({6, 4}), torch::randint(0, 2, {6})});
  return out;
}

json encode_batches(const std::vector<Batch>& bs) {
  json out = json::array();
  for (const auto& b : bs) out.push_back({{"x", ampp_oracle::encode(b.x)}, {"y", ampp_oracle::encode(b.y)}});
  return out;
}

void train(torch::nn::Sequential& model, torch::optim::Optimizer& opt, const std::vector<Batch>& bs,
           ampp::GradScaler* scaler = nullptr) {
  for (const auto& b : bs) {
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(b.x), b.y);
    if (!scaler) {
      loss.backward();
      opt.step();
      continue;
    }
    scaler->scale(loss).backward();
    scaler->step(opt);
    scaler->update();
  }
}

void expect_same_weights(torch::nn::Sequential& model, const json& oracle, bool bitwise) {
  int compared = 0;
  for (const auto& [key, encoded] : oracle.at("tensors").items()) {
    const auto ours = ampp::module_state_dict(*model).at(key).toTensor();
    const auto theirs = ampp_oracle::decode(encoded);
    if (bitwise || !at::isFloatingType(theirs.scalar_type())) {
      EXPECT_TRUE(ampp_oracle::same_bits(ours, theirs)) << key;
    } else {
      EXPECT_TRUE(torch::allclose(ours, theirs, 1e-5, 1e-7)) << key << "\n" << ours << "\n" << theirs;
    }
    ++compared;
  }
  EXPECT_EQ(compared, 9);  // two Linear (weight, bias), BatchNorm (weight, bias, 2 running stats, count)
}

class PyTorchCheckpoint : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }  // as the oracle: one reduction order
};

using Save = std::function<void(const std::string& path, torch::nn::Sequential& model, torch::optim::Optimizer& opt,
                                ampp::GradScaler& scaler, int64_t epoch)>;

// A run trained, saved with `save`, opened by plain torch.load and trained on in Python and here alike.
void expect_python_resumes(const std::string& optimizer, const Save& save) {
  TempDir tmp;
  const std::string path = (tmp.path() / "ckpt.pt").string();
  torch::manual_seed(1);
  auto model = make_model();
  auto opt = make_optimizer(optimizer, model, 0.05);
  ampp::GradScaler scaler(ampp::GradScalerOptions().init_scale(1024.0).growth_interval(2));
  train(model, *opt, batches(3, 2), &scaler);
  save(path, model, *opt, scaler, 5);
  const auto more = batches(2, 3);
  auto answer = ampp_oracle::run(
      "pytorch_checkpoint_oracle.py",
      {{"mode", "load"}, {"path", path}, {"optimizer", optimizer}, {"continue", encode_batches(more)}});
  if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
  EXPECT_EQ(answer->at("epoch"), 5);
  EXPECT_EQ(answer->at("lr").get<double>(), 0.05);
  if (!answer->at("scaler").is_null()) {
    EXPECT_EQ(answer->at("scaler").at("scale").get<double>(), scaler.get_scale());
    EXPECT_EQ(answer->at("scaler").at("growth_tracker").get<int64_t>(), scaler.get_growth_tracker());
  }
  train(model, *opt, more);
  expect_same_weights(model, *answer, optimizer == "sgd");
}

TEST_P(PyTorchCheckpoint, AmppWritesWhatPlainTorchLoadReadsAndTrainsOnExactly) {
  expect_python_resumes(GetParam(), [](const std::string& path, torch::nn::Sequential& model,
                                       torch::optim::Optimizer& opt, ampp::GradScaler& scaler, int64_t epoch) {
    auto ckpt = ampp::make_pytorch_dict();
    ckpt.insert("model", ampp::module_state_dict(*model));
    ckpt.insert("optimizer", ampp::optimizer_state_dict(opt));
    ckpt.insert("scaler", ampp::scaler_state_dict(scaler));
    ckpt.insert("epoch", epoch);
    ampp::save_pytorch(ckpt, path);
  });
}

#if AMPP_ORACLE_HAS_TRAIN
// The same file from one call of ampp::save (train/save.h).
TEST_P(PyTorchCheckpoint, OneAmppSaveIsWhatPlainTorchLoadReadsAndTrainsOnExactly) {
  expect_python_resumes(GetParam(), [](const std::string& path, torch::nn::Sequential& model,
                                       torch::optim::Optimizer& opt, ampp::GradScaler& scaler, int64_t epoch) {
    ampp::save(path, {{"model", model}, {"optimizer", opt}, {"scaler", scaler}, {"epoch", epoch}});
  });
}
#endif

TEST_P(PyTorchCheckpoint, TorchSaveOfStateDictsLoadsIntoLibTorchAndTrainsOnExactly) {
  TempDir tmp;
  const std::string path = (tmp.path() / "from_python.pt").string();
  const auto before = batches(3, 4), more = batches(2, 5);
  auto answer = ampp_oracle::run("pytorch_checkpoint_oracle.py", {{"mode", "save"},
                                                                  {"path", path},
                                                                  {"optimizer", GetParam()},
                                                                  {"lr", 0.05},
                                                                  {"before", encode_batches(before)},
                                                                  {"continue", encode_batches(more)}});
  if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
  const auto ckpt = ampp::load_pytorch(path).toGenericDict();
  torch::manual_seed(9);  // other initial weights: every one must come from the file
  auto model = make_model();
  ampp::load_module_state_dict(*model, ckpt.at("model"));
  auto opt = make_optimizer(GetParam(), model, 123.0);  // the file's lr must win
  ampp::load_optimizer_state_dict(*opt, ckpt.at("optimizer"));
  ampp::GradScaler scaler;
  ampp::load_scaler_state_dict(scaler, ckpt.at("scaler"));
  EXPECT_EQ(scaler.get_scale(), answer->at("scaler").at("scale").get<double>());
  EXPECT_EQ(scaler.get_growth_tracker(), answer->at("scaler").at("growth_tracker").get<int64_t>());
  EXPECT_EQ(ckpt.at("epoch").toInt(), 4);
  train(model, *opt, more);
  expect_same_weights(model, *answer, GetParam() == "sgd");
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PyTorchCheckpoint, ::testing::Values("sgd", "adam"));

TEST(PyTorchCheckpointErrors, MismatchesAreOneErrorListingThemAll) {
  auto model = make_model();
  auto state = ampp::module_state_dict(*model);
  ASSERT_EQ(state.erase("0.bias"), 1u);
  state.insert("extra.weight", torch::zeros({1}));
  state.insert_or_assign("3.weight", torch::zeros({5, 5}));
  try {
    ampp::load_module_state_dict(*model, state);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_THAT(m, HasSubstr("Missing key(s) in state_dict: \"0.bias\""));
    EXPECT_THAT(m, HasSubstr("Unexpected key(s) in state_dict: \"extra.weight\""));
    EXPECT_THAT(m, HasSubstr("size mismatch for 3.weight"));
  }
  state.insert_or_assign("3.weight", model[3]->as<torch::nn::Linear>()->weight.detach().clone());
  AMPP_EXPECT_THROW_WITH(ampp::load_module_state_dict(*model, state), "Missing key(s)");
  ampp::load_module_state_dict(*model, state, /*strict=*/false);  // only missing/unexpected: allowed
}

TEST(PyTorchCheckpointErrors, NotATorchSaveFileIsOneLine) {
  TempDir tmp;
  const auto path = tmp.path() / "not.pt";
  {
    std::ofstream(path) << "hello";
  }
  AMPP_EXPECT_THROW_WITH(ampp::load_pytorch(path.string()), "is not a zip-format torch.save file");
  AMPP_EXPECT_THROW_WITH(ampp::load_pytorch((tmp.path() / "missing.pt").string()), "cannot open");
}

}  // namespace
}  // namespace ampp_test
