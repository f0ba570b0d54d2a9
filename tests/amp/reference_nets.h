#pragma once
// Small reference models and seeded synthetic data for the opt-level tests and benchmarks.
// Shapes are parameters so tests stay tiny while benchmarks use Fashion-MNIST shapes (1x28x28, 10 classes).

#include <torch/torch.h>

#include <cstdint>

namespace ampp_test {

/// conv-BN-relu-pool x2, then a linear classifier: the "reference CNN with BatchNorm".
struct RefCnnImpl : torch::nn::Module {
  RefCnnImpl(int64_t side = 12, int64_t c1 = 8, int64_t c2 = 16, int64_t classes = 10)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, c1, 3).padding(1)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(c1))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c1, c2, 3).padding(1)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(c2))),
        fc(register_module("fc", torch::nn::Linear(c2 * (side / 4) * (side / 4), classes))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    h = torch::max_pool2d(torch::relu(bn2(conv2(h))), 2);
    return fc(h.flatten(1));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc;
};
TORCH_MODULE(RefCnn);

/// 784-hidden-hidden-10 MLP (the reference MLP).
struct RefMlpImpl : torch::nn::Module {
  RefMlpImpl(int64_t in = 784, int64_t hidden = 1024, int64_t classes = 10)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, classes))) {}

  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x.flatten(1)))))); }

  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(RefMlp);

/// Seeded, learnable classification data: each class is a fixed random image plus noise.
struct SyntheticImages {
  torch::Tensor images;  // [n, 1, side, side] float32
  torch::Tensor labels;  // [n] int64

  static SyntheticImages make(int64_t n, int64_t side, int64_t classes, uint64_t seed, double noise = 1.0) {
    torch::Generator gen = at::detail::createCPUGenerator(seed);
    auto templates = torch::randn({classes, 1, side, side}, gen);
    auto labels = torch::randint(classes, {n}, gen, torch::kLong);
    auto images = templates.index_select(0, labels) + noise * torch::randn({n, 1, side, side}, gen);
    return {images, labels};
  }
};

}  // namespace ampp_test
