// pytorch/examples' C++ MNIST example (cpp/mnist: a two-convolution network trained with SGD on LibTorch's
// data loader), given what its Python counterparts have: bf16 autocast, DistributedDataParallel over the
// processes of `ampp run`, and a DistributedSampler feeding LibTorch's own data loader. The data is any
// MNIST-format folder, Debian's Fashion-MNIST by default. The lines ampp adds are marked "ampp:".
//
//   ampp run --nproc-per-node 2 -- build/examples/mnist_ddp_bf16 [--epochs 1] [--steps N] [--data DIR]
#include <ampp/ampp.h>

#include <CLI/CLI.hpp>

#include <cstdio>

// The network of cpp/mnist: conv(1->10, 5) - pool - relu, conv(10->20, 5) - dropout - pool - relu, fc 320->50,
// dropout, fc 50->10, log-softmax. As a TORCH_MODULE: DDP and amp take module holders.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 10, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(10, 20, 5)))),
        conv2_drop(register_module("conv2_drop", torch::nn::Dropout2d())),
        fc1(register_module("fc1", torch::nn::Linear(320, 50))),
        fc2(register_module("fc2", torch::nn::Linear(50, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = torch::relu(fc1->forward(x.view({-1, 320})));
    x = torch::dropout(x, /*p=*/0.5, /*train=*/is_training());
    return torch::log_softmax(fc2->forward(x), /*dim=*/1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

// One split of an MNIST-format folder (read by ampp::train::load_mnist_folder) as a LibTorch dataset.
class MnistSplit : public torch::data::datasets::Dataset<MnistSplit> {
 public:
  explicit MnistSplit(ampp::train::Dataset split) : split_(std::move(split)) {}
  torch::data::Example<> get(size_t index) override {
    const auto i = static_cast<int64_t>(index);
    return {split_.rows(i, i + 1)[0], split_.labels[i]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(split_.size()); }

 private:
  ampp::train::Dataset split_;
};

int main(int argc, char** argv) {
  CLI::App app{"cpp/mnist with bf16 autocast and DDP under ampp run"};
  int64_t epochs = 1, steps = 0;
  std::string data_dir = ampp::train::kFashionMnistDir;
  app.add_option("--epochs", epochs, "epochs");
  app.add_option("--steps", steps, "stop after this many steps per epoch (0: the whole epoch)");
  app.add_option("--data", data_dir, "an MNIST-format folder");
  CLI11_PARSE(app, argc, argv);

  auto pg = ampp::dist::init_process_group();  // ampp: env:// from `ampp run`
  torch::manual_seed(1);
  auto data = ampp::train::load_mnist_folder(data_dir);
  Net model;
  ampp::dist::DistributedDataParallel ddp(model, pg);  // ampp: rank 0's weights everywhere, gradients averaged
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));

  ampp::dist::DistributedSampler sampler(static_cast<size_t>(data.train.size()), pg);  // ampp: this rank's share
  auto train_loader = torch::data::make_data_loader(MnistSplit(data.train).map(torch::data::transforms::Stack<>()),
                                                    sampler, torch::data::DataLoaderOptions().batch_size(64));
  auto test_loader = torch::data::make_data_loader(MnistSplit(data.test).map(torch::data::transforms::Stack<>()),
                                                   torch::data::DataLoaderOptions().batch_size(1000));
  double first_loss = -1, last_loss = 0, accuracy = 0;
  for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
    sampler.set_epoch(epoch);  // ampp: reaches the loader's copy, a new order every epoch
    model->train();
    int64_t step = 0;
    for (auto& batch : *train_loader) {
      optimizer.zero_grad();
      torch::Tensor output;
      {
        ampp::autocast region(torch::kCPU, torch::kBFloat16);  // ampp: bf16 until the end of the block
        output = ddp.forward(batch.data);
      }
      auto loss = torch::nll_loss(output.to(torch::kFloat), batch.target);
      loss.backward();  // bf16 keeps float32's range: no loss scaling (docs/numerics.md)
      optimizer.step();
      last_loss = loss.item<double>();
      if (first_loss < 0) first_loss = last_loss;
      if (++step % 100 == 0 && pg.rank() == 0)
        std::printf("epoch %lld step %lld loss %.4f\n", (long long)epoch, (long long)step, last_loss);
      if (steps > 0 && step >= steps) break;
    }
    // Every rank evaluates the whole test split (as cpp/mnist's test()); rank 0 prints it.
    model->eval();
    torch::NoGradGuard no_grad;
    double test_loss = 0, correct = 0;
    for (const auto& batch : *test_loader) {
      ampp::autocast region(torch::kCPU, torch::kBFloat16);
      auto output = model->forward(batch.data).to(torch::kFloat);
      test_loss += torch::nll_loss(output, batch.target, {}, torch::Reduction::Sum).item<double>();
      correct += output.argmax(1).eq(batch.target).sum().item<double>();
    }
    const auto n = static_cast<double>(data.test.size());
    accuracy = 100 * correct / n;
    if (pg.rank() == 0)
      std::printf("epoch %lld: test loss %.4f, accuracy %.2f %%\n", (long long)epoch, test_loss / n, accuracy);
  }
  if (pg.rank() == 0) std::printf("training loss %.4f -> %.4f\n", first_loss, last_loss);
  return accuracy > 30 ? 0 : 1;  // learnt: 3x chance (every rank evaluates the same weights)
}
