// The C++ half of one training run handed back and forth between Python and C++, written with
// LibTorch and ampp's library calls (the Python half is examples/python/train_cnn.py, the same job
// with the same flags; `ampp train --resume-from` is the same again as a command).
//
//   python examples/python/train_cnn.py --data synthetic:384 --batch-size 32 --steps 5 --save py.pt
//   handoff_cnn --data synthetic:384 --batch-size 32 --resume-from py.pt --steps 16 --save cpp.pt
//   python examples/python/train_cnn.py --data synthetic:384 --batch-size 32 --resume-from cpp.pt --steps 20
//
// Python (train_cnn.py)                                  C++ (below)
// ckpt = torch.load(path)                                ampp::load_pytorch(path).toGenericDict()
// model.load_state_dict(ckpt["model"])                   ampp::load_module_state_dict(*model, ckpt.at("model"))
// opt.load_state_dict(ckpt["optimizer"])                 ampp::load_optimizer_state_dict(opt, ...)
// scaler.load_state_dict(ckpt["scaler"])                 ampp::load_scaler_state_dict(scaler, ...)
// sampler = DistributedSampler(data, seed=seed)          ampp::dist::DistributedSampler(n, options.seed(seed))
// scaler.scale(loss).backward(); scaler.step(opt) ...    the same calls on ampp::GradScaler
// torch.save({"model": ..., ...}, path)                  ampp::save_pytorch(dict, path) (atomic)
#include <ampp/ampp.h>
#include <ampp/train/batches.h>
#include <ampp/train/dataset.h>
#include <ampp/train/models.h>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

namespace {

struct Args {
  std::string data = "fashion-mnist";
  uint64_t seed = 0;
  int64_t batch_size = 128, epochs = 3, steps = 1000000000000;
  double lr = 0.05, momentum = 0.9, weight_decay = 1e-4;
  std::string resume_from, save;
};

// Where the run stands: the epoch to continue, batches of it done, steps taken in all.
struct Position {
  int64_t epoch = 0, batch = 0, step = 0;
};

Position load(const std::string& path, torch::nn::Module& model, torch::optim::SGD& opt, ampp::GradScaler& scaler) {
  const auto ckpt = ampp::load_pytorch(path).toGenericDict();
  ampp::load_module_state_dict(model, ckpt.at("model"));  // strict, as load_state_dict
  ampp::load_optimizer_state_dict(opt, ckpt.at("optimizer"));
  if (ckpt.contains("scaler") && !ckpt.at("scaler").toGenericDict().empty())
    ampp::load_scaler_state_dict(scaler, ckpt.at("scaler"));
  const auto batch = ckpt.contains("batch") ? ckpt.at("batch").toInt() : 0;
  return {ckpt.at("epoch").toInt(), batch, ckpt.at("step").toInt()};
}

void save(const std::string& path, const torch::nn::Module& model, const torch::optim::SGD& opt,
          const ampp::GradScaler& scaler, const Position& at) {
  auto ckpt = ampp::make_pytorch_dict();
  ckpt.insert("model", ampp::module_state_dict(model));
  ckpt.insert("optimizer", ampp::optimizer_state_dict(opt));
  ckpt.insert("scaler", ampp::scaler_state_dict(scaler));
  ckpt.insert("epoch", at.epoch);
  ckpt.insert("batch", at.batch);
  ckpt.insert("step", at.step);
  ampp::save_pytorch(ckpt, path);  // atomic: never half-written
  fmt::print("saved {}: epoch {}, batch {}, step {}\n", path, at.epoch, at.batch, at.step);
}

void train(const Args& args) {
  torch::set_num_threads(1);
  torch::manual_seed(args.seed);
  const auto data = ampp::train::load_dataset(args.data, args.seed);
  auto model = ampp::train::make_model("cnn");
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(args.lr).momentum(args.momentum).weight_decay(args.weight_decay));
  ampp::GradScaler scaler;  // fp32 here: the scale is a power of two and changes no bit
  Position at;
  if (!args.resume_from.empty()) at = load(args.resume_from, *model, opt, scaler);
  ampp::dist::DistributedSampler sampler(
      data.train.size(), ampp::dist::DistributedSamplerOptions().num_replicas(1).rank(0).seed(args.seed));
  model->train();
  for (; at.epoch < args.epochs && at.step < args.steps; ++at.epoch, at.batch = 0) {
    sampler.set_epoch(at.epoch);
    const auto order = sampler.indices();
    ampp::train::BatchIterator batches(data.train, {order.begin(), order.end()}, args.batch_size, /*drop_last=*/true);
    batches.skip_to(at.batch);
    while (at.step < args.steps) {
      auto batch = batches.next();
      if (!batch) break;
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch->data).to(torch::kFloat32), batch->target);
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      ++at.step;
      at.batch = batches.position();
    }
    if (at.batch < batches.num_batches()) break;  // stopped mid-epoch: the position says where
  }
  if (!args.save.empty()) save(args.save, *model, opt, scaler, at);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"The C++ half of a training run handed between Python and C++ (PyTorch-format checkpoints)"};
  app.add_option("--data", args.data, "fashion-mnist, synthetic[:N] or an MNIST-format folder");
  app.add_option("--seed", args.seed);
  app.add_option("--batch-size", args.batch_size)->check(CLI::PositiveNumber);
  app.add_option("--epochs", args.epochs)->check(CLI::PositiveNumber);
  app.add_option("--steps", args.steps, "stop when the run has taken this many steps in all")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", args.lr);
  app.add_option("--momentum", args.momentum);
  app.add_option("--weight-decay", args.weight_decay);
  app.add_option("--resume-from", args.resume_from, "a training dict from torch.save, this program or ampp train");
  app.add_option("--save", args.save, "write the training dict here at the end");
  CLI11_PARSE(app, argc, argv);
  try {
    train(args);
  } catch (const std::exception& e) {
    fmt::print(stderr, "handoff_cnn: {}\n", e.what());
    return 1;
  }
  return 0;
}
