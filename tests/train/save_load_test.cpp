// ampp::save / ampp::load (train/save.h): a user's loop checkpointed in one call each way. Round trips are
// bit for bit (the run that resumes continues exactly as the one that did not stop), under O2 bf16 with
// its FP32 masters and with a GradScaler; errors name the file and the entry. (Python opening the file:
// tests/oracle/save_load_oracle_test.cpp.)
#include <ampp/amp/initialize.h>
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/train/save.h>
#include <gmock/gmock.h>
#include <torch/torch.h>

#include "ampp_test.h"
#include "dist/multiprocess.h"

namespace ampp_test {
namespace {

torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 4));
}

std::pair<torch::Tensor, torch::Tensor> batch(int64_t i) {
  torch::manual_seed(100 + static_cast<uint64_t>(i));
  return {torch::randn({12, 8}), torch::randint(0, 4, {12})};
}

void expect_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].scalar_type(), b[i].scalar_type()) << what << " " << i;
    EXPECT_TRUE(torch::equal(a[i], b[i])) << what << " " << i;
  }
}

// apex O2 with bf16 weights, FP32 masters and AdamW: one training run in an object.
struct O2Run {
  explicit O2Run(uint64_t seed)
      : model(make_model(seed)),
        optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1)),
        amp(ampp::initialize(model, optimizer, ampp::Properties("O2").cast_model_type(torch::kBFloat16).verbosity(0))) {
  }
  void step(int64_t i) {
    const auto [x, y] = batch(i);
    optimizer.zero_grad();
    amp.scale_loss(torch::nn::functional::cross_entropy(amp.forward(model, x), y)).backward();
    amp.step();
  }
  torch::nn::Sequential model;
  torch::optim::AdamW optimizer;
  ampp::Amp amp;
};

TEST(SaveLoad, AnO2RunResumesBitForBitFromOneSaveAndOneLoad) {
  at::set_num_threads(1);
  TempDir tmp;
  const std::string path = (tmp.path() / "run.pt").string();
  O2Run a(1);
  for (int64_t i = 0; i < 3; ++i) a.step(i);
  int64_t epoch = 7;
  std::string note = "after three steps";
  ampp::save(path, {{"model", a.model}, {"optimizer", a.optimizer}, {"amp", a.amp}, {"epoch", epoch}, {"note", note}});

  O2Run b(2);  // other weights and no optimizer state: everything must come from the file
  int64_t epoch_b = 0;
  std::string note_b;
  ampp::load(path,
             {{"model", b.model}, {"optimizer", b.optimizer}, {"amp", b.amp}, {"epoch", epoch_b}, {"note", note_b}});
  EXPECT_EQ(epoch_b, 7);
  EXPECT_EQ(note_b, note);
  expect_same(a.model->parameters(), b.model->parameters(), "bf16 parameter");
  expect_same(a.model->buffers(), b.model->buffers(), "buffer");
  expect_same(a.amp.master_params(a.optimizer), b.amp.master_params(b.optimizer), "FP32 master");
  EXPECT_EQ(a.amp.scaler().get_scale(), b.amp.scaler().get_scale());
  for (int64_t i = 3; i < 6; ++i) a.step(i), b.step(i);
  expect_same(a.model->parameters(), b.model->parameters(), "parameter after resuming");
  expect_same(a.amp.master_params(a.optimizer), b.amp.master_params(b.optimizer), "master after resuming");
}

TEST(SaveLoad, AGradScalerLoopResumesBitForBit) {
  at::set_num_threads(1);
  TempDir tmp;
  const std::string path = (tmp.path() / "scaled.pt").string();
  struct Run {
    explicit Run(uint64_t seed)
        : model(make_model(seed)),
          optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)),
          scaler(ampp::GradScalerOptions().init_scale(3e38).growth_interval(2)) {}
    void step(int64_t i) {
      const auto [x, y] = batch(i);
      optimizer.zero_grad();
      scaler.scale(torch::nn::functional::cross_entropy(model->forward(x), y) * 1e4).backward();  // overflows at first
      scaler.step(optimizer);
      scaler.update();
    }
    torch::nn::Sequential model;
    torch::optim::SGD optimizer;
    ampp::GradScaler scaler;
  } a(1), b(2);
  for (int64_t i = 0; i < 5; ++i) a.step(i);
  ASSERT_LT(a.scaler.get_scale(), 1e38) << "the scaler backed off";
  ampp::save(path, {{"model", a.model}, {"optimizer", a.optimizer}, {"scaler", a.scaler}});
  ampp::load(path, {{"model", b.model}, {"optimizer", b.optimizer}, {"scaler", b.scaler}});
  EXPECT_EQ(b.scaler.get_scale(), a.scaler.get_scale());
  EXPECT_EQ(b.scaler.get_growth_tracker(), a.scaler.get_growth_tracker());
  for (int64_t i = 5; i < 9; ++i) a.step(i), b.step(i);
  expect_same(a.model->parameters(), b.model->parameters(), "parameter after resuming");
  EXPECT_EQ(b.scaler.get_scale(), a.scaler.get_scale());
}

TEST(SaveLoad, VariablesOfEveryKindComeBackAndTensorsToTheirDevice) {
  TempDir tmp;
  const std::string path = (tmp.path() / "values.pt").string();
  int small = -3;
  double lr = 0.125;
  bool done = true;
  auto tensor = torch::arange(6, torch::kFloat).reshape({2, 3});
  ampp::StateDict extra{{"sampler_epoch", int64_t{4}}, {"seen", 12.5}};
  ampp::save(path, {{"small", small}, {"lr", lr}, {"done", done}, {"tensor", tensor}, {"extra", extra}});
  int small_b = 0;
  double lr_b = 0;
  bool done_b = false;
  torch::Tensor tensor_b;  // undefined: loaded onto the CPU
  ampp::StateDict extra_b;
  ampp::load(path, {{"small", small_b}, {"lr", lr_b}, {"done", done_b}, {"tensor", tensor_b}, {"extra", extra_b}});
  EXPECT_EQ(small_b, -3);
  EXPECT_EQ(lr_b, 0.125);
  EXPECT_TRUE(done_b);
  EXPECT_TRUE(torch::equal(tensor_b, tensor));
  EXPECT_EQ(extra_b.at("sampler_epoch").toInt(), 4);
  EXPECT_EQ(extra_b.at("seen").toDouble(), 12.5);
}

TEST(SaveLoad, MistakesAreOneErrorNamingTheFileAndTheEntry) {
  TempDir tmp;
  const std::string path = (tmp.path() / "run.pt").string();
  auto model = make_model(1);
  int64_t epoch = 1;
  std::string name = "x";
  AMPP_EXPECT_THROW_WITH(ampp::save(path, {{"model", model}, {"model", epoch}}), "two entries are named \"model\"");
  AMPP_EXPECT_THROW_WITH(ampp::save(path, {{"", model}}), "an entry has an empty name");
  EXPECT_FALSE(std::filesystem::exists(path)) << "nothing is written when an entry is refused";
  ampp::save(path, {{"model", model}, {"epoch", epoch}, {"name", name}});
  AMPP_EXPECT_THROW_WITH(ampp::load(path, {{"model", model}, {"scaler", epoch}}),
                         "ampp::load('" + path + "'): the file has no \"scaler\"; it holds \"model\", \"epoch\"");
  AMPP_EXPECT_THROW_WITH(ampp::load(path, {{"name", epoch}}), "\"name\": must be a int, got String");
  auto other = torch::nn::Sequential(torch::nn::Linear(8, 3));
  AMPP_EXPECT_THROW_WITH(ampp::load(path, {{"model", other}}), "\"model\": ");
  int too_small = 0;
  int64_t big = int64_t{1} << 40;
  ampp::save(path, {{"big", big}});
  AMPP_EXPECT_THROW_WITH(ampp::load(path, {{"big", too_small}}), "does not fit the int it is loaded into");
  ampp::save_pytorch(c10::IValue(int64_t{3}), path);
  AMPP_EXPECT_THROW_WITH(ampp::load(path, {{"model", model}}), "the file holds a Int, not the dict");
}

// With a default process group only rank 0 writes; every rank loads the same file, the DDP-wrapped model
// included (its state without DDP's "module." prefix, so the file loads into a plain model too).
TEST(SaveLoad, OnTwoRanksRankZeroWritesAndEveryRankLoads) {
  TempDir tmp;
  const auto path_of = [&](int rank) { return (tmp.path() / ("from_rank" + std::to_string(rank) + ".pt")).string(); };
  on_ranks(2, [&](int rank, const ampp::dist::ProcessGroup& group) {
    auto model = make_model(1);
    ampp::dist::DistributedDataParallel<torch::nn::Sequential> ddp(model, group);
    int64_t step = 10;
    ampp::save(path_of(rank), {{"model", ddp}, {"step", step}});  // each rank names its own file
    group.barrier();
    EXPECT_TRUE(std::filesystem::exists(path_of(0)));
    EXPECT_FALSE(std::filesystem::exists(path_of(1))) << "rank 1 wrote";
    auto plain = make_model(2);
    int64_t loaded = -1;
    ampp::load(path_of(0), {{"model", plain}, {"step", loaded}});
    EXPECT_EQ(loaded, 10);
    expect_same(plain->parameters(), model->parameters(), "parameter");
  });
}

}  // namespace
}  // namespace ampp_test
