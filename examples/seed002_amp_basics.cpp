// Seed 002 (the torch.cuda.amp primer) ported to ampp: why fp16 loses small addends, the plain FP32
// loop, the same loop under autocast + GradScaler, and BatchNorm kept in FP32 under apex's O2.
//
// Python (seed 002)                                         C++ (below)
// torch.tensor(2**-3) + torch.tensor(2**-14)                torch::tensor(0x1p-3f) + torch::tensor(0x1p-14f)
// torch.tensor(2**-3).half() + torch.tensor(2**-14).half()  ....to(torch::kHalf) + ....to(torch::kHalf)
// output = net(input)                                       auto output = net->forward(input);
// loss = loss_fn(output, target)                            auto loss = loss_fn(output, target);
// loss.backward()                                           loss.backward();
// optimizer.step()                                          optimizer.step();
// optimizer.zero_grad()                                     optimizer.zero_grad();
// with torch.cuda.amp.autocast():                           { ampp::autocast guard(torch::kCPU, torch::kHalf);
//     output = net(input)                                     output = net->forward(input);
//     loss = loss_fn(output, target)                          loss = loss_fn(output, target); }
// scaler.scale(loss).backward()                             scaler.scale(loss).backward();
// scaler.step(optimizer)                                    scaler.step(optimizer);
// scaler.update()                                           scaler.update();
// optimizer.zero_grad()                                     optimizer.zero_grad();
//
// BN weights to FP32, input from FP16 to FP32 (apex O2's keep_batchnorm_fp32):
//                                                           ampp::initialize(net, optimizer, "O2")
// fp16 on CPU is emulated by ampp (rounding to IEEE half at the edges of lowered ops), so loss
// scaling matters here exactly as on a GPU.
#include <ampp/ampp.h>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

namespace {

// Synthetic classification data with class-dependent means, so the loss can fall.
struct Data {
  torch::Tensor input, target;
};
Data make_data(int64_t n) {
  auto target = torch::randint(10, {n}, torch::kLong);
  auto centers = torch::randn({10, 64});
  return {centers.index_select(0, target) + 0.5 * torch::randn({n, 64}), target};
}

torch::nn::Sequential make_net() {
  return torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::BatchNorm1d(128), torch::nn::ReLU(),
                               torch::nn::Linear(128, 10));
}

// The seed's REPL lines: fp16 values in [2^-3, 2^-2) are 2^-13 apart; 2^-3 + 2^-14 lies exactly halfway
// and the tie rounds to the even neighbour, 2^-3, so the addend is lost; 2^-13 is kept.
bool small_addends() {
  const auto big = torch::tensor(0x1p-3f), small = torch::tensor(0x1p-14f), spacing = torch::tensor(0x1p-13f);
  const float fp32 = (big + small).item<float>();
  const float fp16 = (big.to(torch::kHalf) + small.to(torch::kHalf)).item<float>();
  const float fp16_spacing = (big.to(torch::kHalf) + spacing.to(torch::kHalf)).item<float>();
  fmt::print("2^-3 + 2^-14: fp32 {:.10g}, fp16 {:.10g} (lost); 2^-3 + 2^-13 in fp16: {:.10g}\n", fp32, fp16,
             fp16_spacing);
  return fp32 == 0x1p-3f + 0x1p-14f && fp16 == 0x1p-3f && fp16_spacing == 0x1p-3f + 0x1p-13f;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t epochs = 2, steps = 20, batch_size = 64;
  CLI::App app{"seed 002: the FP32 loop and the autocast + GradScaler loop, fp16 numerics"};
  app.add_option("--epochs", epochs)->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "steps per epoch")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const bool numerics_ok = small_addends();
  torch::manual_seed(2);
  const auto data = make_data(steps * batch_size);
  auto loss_fn = torch::nn::CrossEntropyLoss();
  auto batch = [&](int64_t step) {
    const auto rows = torch::arange(step * batch_size, (step + 1) * batch_size);
    return std::make_pair(data.input.index_select(0, rows), data.target.index_select(0, rows));
  };

  // Loop 1: plain FP32.
  torch::manual_seed(0);
  auto net = make_net();
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  double fp32_first = -1, fp32_last = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    for (int64_t step = 0; step < steps; ++step) {
      auto [input, target] = batch(step);
      auto output = net->forward(input);
      auto loss = loss_fn(output, target);
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      if (fp32_first < 0) fp32_first = loss.item<double>();
      fp32_last = loss.item<double>();
    }
  }

  // Loop 2: the same model and data under fp16 autocast with a GradScaler.
  torch::manual_seed(0);
  auto amp_net = make_net();
  torch::optim::SGD amp_optimizer(amp_net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  ampp::GradScaler scaler;
  double amp_first = -1, amp_last = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    for (int64_t step = 0; step < steps; ++step) {
      auto [input, target] = batch(step);
      torch::Tensor output, loss;
      {
        ampp::autocast guard(torch::kCPU, torch::kHalf);
        output = amp_net->forward(input);
        loss = loss_fn(output, target);
      }
      scaler.scale(loss).backward();
      scaler.step(amp_optimizer);
      scaler.update();
      amp_optimizer.zero_grad();
      if (amp_first < 0) amp_first = loss.item<double>();
      amp_last = loss.item<double>();
    }
  }

  // "BN in FP32": apex O2 casts the model to fp16 but keeps BatchNorm's weights in FP32 and widens
  // its fp16 input to FP32 (keep_batchnorm_fp32); ampp::initialize does the same. On CPU its low
  // dtype defaults to bf16, which shows in the weights' dtypes (emulated fp16 keeps float32 carriers).
  torch::manual_seed(0);
  auto o2_net = make_net();
  torch::optim::SGD o2_optimizer(o2_net->parameters(), torch::optim::SGDOptions(0.05));
  auto amp = ampp::initialize(o2_net, o2_optimizer, "O2");
  const auto linear_weight = o2_net[0]->as<torch::nn::Linear>()->weight.scalar_type();
  const auto bn_weight = o2_net[1]->as<torch::nn::BatchNorm1d>()->weight.scalar_type();
  const auto o2_output = amp.forward(o2_net, batch(0).first);
  fmt::print("O2: Linear weight {}, BatchNorm weight {} (keep_batchnorm_fp32), output {}\n",
             c10::toString(linear_weight), c10::toString(bn_weight), c10::toString(o2_output.scalar_type()));

  fmt::print(
      "seed002: fp32 loss {:.4f} -> {:.4f}; autocast fp16 + GradScaler loss {:.4f} -> {:.4f}, scale {}, "
      "skipped steps {}\n",
      fp32_first, fp32_last, amp_first, amp_last, scaler.get_scale(), scaler.skipped_steps());
  // Both loops must learn, and the fp16 facts of the seed must hold.
  const bool bn_fp32 = linear_weight != torch::kFloat && bn_weight == torch::kFloat;
  if (!numerics_ok || !bn_fp32 || !(fp32_last < fp32_first) || !(amp_last < amp_first)) return 1;
  return 0;
}
