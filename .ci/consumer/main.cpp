// Uses the installed ampp the way a user would, including only <ampp/ampp.h>: one scaled step of a tiny
// model, an LSTM model under O2 bf16 and under fp16 emulation, a StateDict of one's own, and a checkpoint
// saved and loaded in one call each. Exits 1 on the first thing that is not as the docs say.
#include <ampp/ampp.h>
#include <torch/torch.h>

// ampp's public API needs LibTorch and nothing else in a program's code (its libraries link zlib and
// protobuf themselves): no fmt or nlohmann-json types in its headers.
#if defined(FMT_VERSION) || defined(NLOHMANN_JSON_VERSION_MAJOR)
#error "ampp's public headers include fmt or nlohmann-json"
#endif
#if !AMPP_VERSION_AT_LEAST(0, 2, 0)
#error "the installed ampp is older than the 0.2 this program is written for"
#endif

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  std::printf("consumer: %s: %s\n", ok ? "ok" : "FAILED", what);
  failures += ok ? 0 : 1;
}

using State = std::tuple<torch::Tensor, torch::Tensor>;
struct LanguageModelImpl : torch::nn::Module {
  torch::nn::LSTM lstm{register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(8, 16).batch_first(true)))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(16, 5))};
  std::tuple<torch::Tensor, State> forward(const torch::Tensor& x) {
    auto [out, hc] = lstm->forward(x);
    return {head->forward(out), hc};
  }
};
TORCH_MODULE(LanguageModel);

void scaled_step() {
  torch::nn::Linear model(4, 1);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  ampp::GradScaler scaler;
  auto before = model->weight.clone();
  scaler.scale(model->forward(torch::ones({8, 4})).pow(2).mean()).backward();
  scaler.step(opt);
  scaler.update();
  check(!torch::equal(before, model->weight), "a scaled step updates the weights");
}

void nested_outputs_under_o2() {
  LanguageModel model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  auto amp = ampp::initialize(model, opt, ampp::Properties("O2").dtype(torch::kBFloat16).verbosity(0));
  const auto [logits, hc] = amp.forward(model, torch::randn({2, 3, 8}));
  check(logits.scalar_type() == torch::kFloat && std::get<0>(hc).scalar_type() == torch::kFloat &&
            std::get<1>(hc).scalar_type() == torch::kFloat,
        "amp.forward under O2 bf16 returns (output, (h, c)) in float32");
}

void lstm_under_fp16_emulation() {
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(8, 16));
  ampp::autocast guard(torch::kCPU, torch::kHalf);
  const auto out = std::get<0>(lstm->forward(torch::randn({3, 2, 8})));
  check(out.scalar_type() == torch::kHalf || torch::equal(out, out.to(torch::kHalf).to(out.scalar_type())),
        "an nn::LSTM under fp16 emulation is fp16-valued");
}

void state_dict_and_checkpoint() {
  ampp::StateDict sd;
  sd.insert("epoch", int64_t{3});
  ampp::StateDict braced{{"scale", 512.0}};
  check(sd.size() == 1 && braced.at("scale").toDouble() == 512.0, "ampp::StateDict sd; and StateDict{{...}}");

  const auto path = (std::filesystem::temp_directory_path() / "ampp-consumer-run.pt").string();
  torch::nn::Linear model(4, 2), restored(4, 2);
  torch::optim::AdamW opt(model->parameters()), opt2(restored->parameters());
  ampp::GradScaler scaler(ampp::GradScalerOptions().init_scale(1024.0)), scaler2;
  int64_t epoch = 5, epoch2 = 0;
  ampp::save(path, {{"model", model}, {"optimizer", opt}, {"scaler", scaler}, {"epoch", epoch}});
  ampp::load(path, {{"model", restored}, {"optimizer", opt2}, {"scaler", scaler2}, {"epoch", epoch2}});
  std::filesystem::remove(path);
  check(torch::equal(model->weight, restored->weight) && scaler2.get_scale() == 1024.0 && epoch2 == 5,
        "ampp::save and ampp::load round-trip a model, an optimizer, a scaler and a value");
}

}  // namespace

int old_api_still_compiles();  // old_api.cpp

int main() {
  torch::manual_seed(0);
  std::printf("consumer: ampp %s\n", ampp::version());
  scaled_step();
  nested_outputs_under_o2();
  lstm_under_fp16_emulation();
  state_dict_and_checkpoint();
  check(old_api_still_compiles() == 1, "the deprecated names of 0.1 still work");
  return failures == 0 ? 0 : 1;
}
