// Seed 000 ported to ampp: mp.spawn + DistributedDataParallel + autocast + GradScaler + StepLR +
// a rank-0 checkpoint per epoch. Data: ampp's seeded synthetic 28x28 set (no GPU, no ImageNet here).
//
// Python (seed 000)                                        C++ (below)
// torch.multiprocessing.spawn(main_worker, nprocs=n,       ampp::dist::spawn(main_worker, n, n, args)
//                             args=(n, args))
// args.rank = args.rank * ngpus_per_node + gpu             args.rank = args.node_rank * ngpus_per_node + gpu
// dist.init_process_group(backend, init_method=dist_url,   ampp::dist::init_process_group(InitOptions()
//                         world_size, rank)                  .init_method(dist_url).world_size(..).rank(..))
// args.batch_size = int(args.batch_size / ngpus_per_node)  batch_size = args.batch_size / ngpus_per_node
// model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  make_model("cnn", ModelOptions().sync_batch_norm(true))
//   (only with --sync-bn; PyTorch's SyncBatchNorm is GPU-only, ampp's runs on Gloo/CPU)
// model = DistributedDataParallel(model, device_ids=[gpu]) ampp::dist::DistributedDataParallel ddp(model)
// optimizer = SGD(params, 0.1, momentum=0.9, wd=1e-4)      torch::optim::SGD(..., SGDOptions(0.1)...)
// optimizer = ZeroRedundancyOptimizer(params,              ZeroRedundancyOptimizer::of<torch::optim::SGD>(
//     optimizer_class=SGD, lr=0.1, ...)                        params, SGDOptions(0.1)...)  (only with --zero)
// scheduler = StepLR(optimizer, step_size=30, gamma=0.1)   torch::optim::StepLR scheduler(opt, 30, 0.1)
// train_sampler = DistributedSampler(train_dataset)        ampp::dist::DistributedSampler train_sampler(n)
// torch_scaler = torch.cuda.amp.GradScaler()               ampp::GradScaler torch_scaler
// train_sampler.set_epoch(epoch)                           train_sampler.set_epoch(epoch)
// with torch.cuda.amp.autocast(): output = model(images)   { ampp::autocast guard(kCPU, dtype); ... }
// torch_scaler.scale(loss).backward()                      torch_scaler.scale(loss).backward()
// torch_scaler.step(optimizer); torch_scaler.update()      torch_scaler.step(optimizer); ...update()
// scheduler.step()                                         scheduler.step()
// if rank % ngpus_per_node == 0: torch.save(model.module.  if (rank % ngpus_per_node == 0) ampp::save_pytorch(
//     state_dict(), 'checkpoint.pth.tar')                      ampp::module_state_dict(*model), path) (atomic)
//
// The checkpoint is the seed's: a state_dict in PyTorch's format, which Python opens with torch.load
// and `ampp train --model cnn --resume-from` starts a run from (docs/training.md).
#include <ampp/ampp.h>
#include <ampp/train/batches.h>
#include <ampp/train/dataset.h>
#include <ampp/train/models.h>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

namespace {

struct Args {
  int64_t batch_size = 256;  // total over the node's processes, as in the seed
  int64_t epochs = 2;
  int64_t steps = 0;  // 0: whole epochs
  uint64_t seed = 20;
  std::string dist_url = "tcp://127.0.0.1:23456";
  int world_size = 1;  // number of nodes, then processes
  int node_rank = 0;
  int nprocs = 2;
  std::string dtype = "bf16";
  std::string checkpoint = "seed000_checkpoint.pt";
  bool sync_bn = false;
  bool zero = false;
};

// SGD as in the seed; with --zero each rank keeps the momentum of its shard of the parameters only.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& params, bool zero,
                                                        const ampp::dist::ProcessGroup& pg) {
  const auto sgd = torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-4);
  if (!zero) return std::make_unique<torch::optim::SGD>(params, sgd);
  return std::make_unique<ampp::dist::ZeroRedundancyOptimizer>(
      ampp::dist::ZeroRedundancyOptimizer::of<torch::optim::SGD>(
          params, sgd, ampp::dist::ZeroRedundancyOptimizerOptions().process_group(pg)));
}

// Whether `t` is bitwise the same on every rank (MAX and MIN of it agree).
bool same_on_every_rank(const ampp::dist::ProcessGroup& pg, const torch::Tensor& t) {
  std::vector<torch::Tensor> max{t.to(torch::kFloat64)}, min{max[0].clone()};
  pg.c10d()->allreduce(max, c10d::AllreduceOptions{c10d::ReduceOp::MAX})->wait();
  pg.c10d()->allreduce(min, c10d::AllreduceOptions{c10d::ReduceOp::MIN})->wait();
  return torch::equal(max[0], min[0]);
}

void main_worker(int gpu, int ngpus_per_node, Args args) {
  torch::manual_seed(args.seed);
  const int rank = args.node_rank * ngpus_per_node + gpu;  // global rank
  auto pg = ampp::dist::init_process_group(
      ampp::dist::InitOptions().init_method(args.dist_url).world_size(args.world_size).rank(rank));
  auto data = ampp::train::make_synthetic(ampp::train::SyntheticOptions().seed(args.seed));
  // With --sync-bn, BatchNorm's statistics are those of the whole node batch (all ranks).
  auto model = ampp::train::make_model("cnn", ampp::train::ModelOptions().sync_batch_norm(args.sync_bn));
  const int64_t batch_size = args.batch_size / ngpus_per_node;  // per-process batch
  ampp::dist::DistributedDataParallel ddp(model, pg);

  torch::nn::CrossEntropyLoss criterion;
  auto optimizer_holder = make_optimizer(ddp.parameters(), args.zero, pg);
  torch::optim::Optimizer& optimizer = *optimizer_holder;
  torch::optim::StepLR scheduler(optimizer, /*step_size=*/30, /*gamma=*/0.1);
  ampp::dist::DistributedSampler train_sampler(data.train.size(), pg);
  ampp::GradScaler torch_scaler;
  const auto dtype = args.dtype == "fp16" ? torch::kHalf : torch::kBFloat16;

  double first_loss = -1, last_loss = 0;
  for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
    train_sampler.set_epoch(epoch);  // a different shard order every epoch, same on every rank
    const auto shard = train_sampler.indices();
    ampp::train::BatchIterator train_loader(data.train, {shard.begin(), shard.end()}, batch_size,
                                            /*drop_last=*/true);
    model->train();
    int64_t i = 0;
    while (auto batch = train_loader.next()) {
      if (args.steps > 0 && i++ >= args.steps) break;
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        ampp::autocast guard(torch::kCPU, dtype);
        auto output = ddp.forward(batch->data);
        loss = criterion(output, batch->target);
      }
      torch_scaler.scale(loss).backward();
      torch_scaler.step(optimizer);
      torch_scaler.update();
      if (first_loss < 0) first_loss = loss.item<double>();
      last_loss = loss.item<double>();
    }
    scheduler.step();
    if (rank % ngpus_per_node == 0) {
      ampp::save_pytorch(ampp::module_state_dict(*model), args.checkpoint);  // atomic: never half-written
      fmt::print("epoch {}: loss {:.4f}, scale {}, checkpoint {}\n", epoch, last_loss, torch_scaler.get_scale(),
                 args.checkpoint);
    }
  }
  // Every rank must hold the same weights after DDP training; with SyncBatchNorm also the same
  // running statistics (plain BatchNorm's differ after the last forward: each rank saw its own batch).
  std::vector<torch::Tensor> flat_params;
  for (const auto& p : ddp.parameters()) flat_params.push_back(p.detach().flatten());
  TORCH_CHECK(same_on_every_rank(pg, torch::cat(flat_params)), "rank ", rank, ": parameters differ across ranks");
  if (args.sync_bn) {
    for (const auto& b : model->named_buffers())
      TORCH_CHECK(same_on_every_rank(pg, b.value()), "rank ", rank, ": ", b.key(), " differs across ranks");
  }
  TORCH_CHECK(last_loss < first_loss, "rank ", rank, ": loss did not fall (", first_loss, " -> ", last_loss, ")");
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"seed 000: spawn + DDP + autocast + GradScaler + StepLR + rank-0 checkpoint"};
  app.add_option("--batch-size", args.batch_size, "total batch size of the node")->check(CLI::PositiveNumber);
  app.add_option("--epochs", args.epochs)->check(CLI::PositiveNumber);
  app.add_option("--steps", args.steps, "steps per epoch (0: whole epoch)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", args.seed);
  app.add_option("--dist-url", args.dist_url, "tcp://host:port used to set up distributed training");
  app.add_option("--world-size", args.world_size, "number of nodes")->check(CLI::PositiveNumber);
  app.add_option("--rank", args.node_rank, "node rank")->check(CLI::NonNegativeNumber);
  app.add_option("--nprocs", args.nprocs, "processes per node (the seed's GPU count)")->check(CLI::PositiveNumber);
  app.add_option("--dtype", args.dtype)->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--checkpoint", args.checkpoint);
  app.add_flag("--sync-bn", args.sync_bn, "SyncBatchNorm (convert_sync_batchnorm in the Python seed)");
  app.add_flag("--zero", args.zero, "ZeroRedundancyOptimizer around the SGD (optimizer state sharded over the ranks)");
  CLI11_PARSE(app, argc, argv);

  const int ngpus_per_node = args.nprocs;
  args.world_size = ngpus_per_node * args.world_size;  // total processes
  try {
    ampp::dist::spawn(main_worker, ngpus_per_node, ngpus_per_node, args);
  } catch (const std::exception& e) {
    fmt::print(stderr, "seed000: {}\n", e.what());
    return 1;
  }
  fmt::print("seed000: {} processes trained, ranks agree\n", args.world_size);
  return 0;
}
