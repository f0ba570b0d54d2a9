// Seed 001 ported to ampp: apex's amp.initialize + DistributedDataParallel, one process per rank,
// launched like `python -m torch.distributed.launch --nproc_per_node=N main.py`:
//
//   ampp run --nproc-per-node 2 -- ./seed001_apex_ddp
//
// Python (seed 001)                                        C++ (below)
// dist.init_process_group(backend='nccl')                  auto pg = ampp::dist::init_process_group()  (env://)
// train_sampler = DistributedSampler(train_dataset)        ampp::dist::DistributedSampler train_sampler(n, pg)
// model, optimizer = amp.initialize(model, optimizer)      auto amp = ampp::initialize(model, optimizer, opt_level)
// model = DistributedDataParallel(model)                   ampp::dist::DistributedDataParallel ddp(model, pg)
// output = model(images); loss = criterion(output, target) output = amp.forward(ddp, images); loss = criterion(..)
// optimizer.zero_grad()                                    optimizer.zero_grad()
// with amp.scale_loss(loss, optimizer) as scaled_loss:     amp.scale_loss(loss).backward()
//     scaled_loss.backward()
// optimizer.step()                                         amp.step()   (ampp cannot patch optimizer.step)
#include <ampp/ampp.h>
#include <ampp/train/batches.h>
#include <ampp/train/dataset.h>
#include <ampp/train/models.h>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  int64_t epochs = 2, steps = 0, batch_size = 64;
  std::string opt_level = "O1";
  CLI::App app{"seed 001: apex-style initialize + DDP; run it under `ampp run` (or torchrun)"};
  app.add_option("--epochs", epochs)->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "steps per epoch (0: whole epoch)")->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size", batch_size, "per-process batch size")->check(CLI::PositiveNumber);
  app.add_option("--opt-level", opt_level)->check(CLI::IsMember({"O0", "O1", "O2", "O3"}));
  CLI11_PARSE(app, argc, argv);

  try {
    auto pg = ampp::dist::init_process_group();  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    torch::manual_seed(1);
    auto data = ampp::train::make_synthetic(ampp::train::SyntheticOptions().seed(1));
    ampp::dist::DistributedSampler train_sampler(data.train.size(), pg);

    auto model = ampp::train::make_model("cnn");
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto amp = ampp::initialize(model, optimizer, opt_level);  // before DDP, as apex requires
    ampp::dist::DistributedDataParallel ddp(model, pg);
    torch::nn::CrossEntropyLoss criterion;

    double first_loss = -1, last_loss = 0;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      train_sampler.set_epoch(epoch);
      const auto shard = train_sampler.indices();
      ampp::train::BatchIterator train_loader(data.train, {shard.begin(), shard.end()}, batch_size, true);
      int64_t i = 0;
      while (auto batch = train_loader.next()) {
        if (steps > 0 && i++ >= steps) break;
        auto output = amp.forward(ddp, batch->data);
        auto loss = criterion(output, batch->target);
        optimizer.zero_grad();
        amp.scale_loss(loss).backward();
        amp.step();
        if (first_loss < 0) first_loss = loss.item<double>();
        last_loss = loss.item<double>();
      }
      if (pg.rank() == 0) fmt::print("epoch {}: loss {:.4f}\n", epoch, last_loss);
    }
    TORCH_CHECK(last_loss < first_loss, "loss did not fall (", first_loss, " -> ", last_loss, ")");
    if (pg.rank() == 0)
      fmt::print("seed001: {} ranks, {} done, loss {:.4f} -> {:.4f}\n", pg.size(), opt_level, first_loss, last_loss);
  } catch (const std::exception& e) {
    fmt::print(stderr, "seed001: {}\n", e.what());
    return 1;
  }
  return 0;
}
