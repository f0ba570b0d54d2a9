// A DCGAN under one ampp::initialize: a generator and a discriminator, their Adam optimizers, and three losses
// with loss scales of their own; each optimizer is stepped when its own backward is done. Both models are in
// DistributedDataParallel over spawned ranks, and a checkpoint per epoch resumes the run exactly. The loop is
// PyTorch's DCGAN example's (pytorch/examples dcgan/main.py), on ampp's synthetic 28x28 images.
//
// Python (apex, dcgan/main.py)                              C++ (below)
// [G, D], [optG, optD] = amp.initialize([G, D], [optG,     auto amp = ampp::initialize({G, D}, {&opt_g, &opt_d},
//     optD], opt_level, num_losses=3)                          Properties(level).num_losses(3))
// G, D = DDP(G), DDP(D)                                     DistributedDataParallel g_ddp(G), d_ddp(D)
// output = netD(real); errD_real = criterion(output, 1)     amp.forward(d_ddp, real) ... bce(.., 1)
// with amp.scale_loss(errD_real, optD, loss_id=0) as s:     amp.scale_loss(errD_real, opt_d, 0).backward()
//     s.backward()
// fake = netG(noise); output = netD(fake.detach())          fake = amp.forward(g_ddp, noise) ...
// with amp.scale_loss(errD_fake, optD, loss_id=1) ...       amp.scale_loss(errD_fake, opt_d, 1).backward()
// optimizerD.step()                                         amp.step(opt_d)     (D alone: G's weights untouched)
// output = netD(fake); errG = criterion(output, 1)          amp.forward(d_ddp, fake) ... bce(.., 1)
// with amp.scale_loss(errG, optG, loss_id=2) ...            amp.scale_loss(errG, opt_g, 2).backward()
// optimizerG.step()                                         amp.step(opt_g)
//
//   dcgan [--opt-level O1|O2] [--dtype bf16|fp16] [--nprocs 2] [--epochs 2] [--steps 10]
//         [--checkpoint dcgan.pt] [--resume]
//
// At the end every rank checks that both models' weights are the same on all ranks, and rank 0 prints a
// checksum of them (tests/examples/dcgan_resume.sh compares a resumed run's with an uninterrupted one's).
#include <ampp/ampp.h>
#include <ampp/train/batches.h>
#include <ampp/train/dataset.h>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <cmath>

namespace {

constexpr int64_t kNoise = 16;

struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl() {
    fc = register_module("fc", torch::nn::Linear(kNoise, 64 * 7 * 7));
    up1 = register_module(
        "up1", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(64, 32, 4).stride(2).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(32));
    up2 = register_module("up2",
                          torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(32, 1, 4).stride(2).padding(1)));
  }
  torch::Tensor forward(const torch::Tensor& z) {
    auto x = torch::relu(fc(z)).view({-1, 64, 7, 7});
    return torch::tanh(up2(torch::relu(bn(up1(x)))));  // [B, 1, 28, 28]
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::ConvTranspose2d up1{nullptr}, up2{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 4).stride(2).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 4).stride(2).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(64));
    fc = register_module("fc", torch::nn::Linear(64 * 7 * 7, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::leaky_relu(conv1(x), 0.2);
    h = torch::leaky_relu(bn(conv2(h)), 0.2);
    return fc(h.flatten(1)).view({-1});  // one logit per image
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Discriminator);

struct Args {
  std::string opt_level = "O1", dtype = "bf16", dist_url = "tcp://127.0.0.1:23470", checkpoint = "dcgan.pt";
  int nprocs = 2;
  int64_t epochs = 2, steps = 10, batch_size = 64;
  bool resume = false;
};

torch::Tensor bce(const torch::Tensor& logits, double target) {
  return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, target));
}

// The models, optimizers and each loss's scaler: what a checkpoint holds (rank 0 writes it, atomically).
struct Gan {
  Generator g;
  Discriminator d;
  torch::optim::Adam opt_g{g->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})};
  torch::optim::Adam opt_d{d->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})};
};

// One call each way (ampp/train/save.h): a PyTorch-format file, written atomically by rank 0, read through
// ampp's checked reader. The models and optimizers before the amp state, as apex orders them.
void save(Gan& gan, ampp::Amp& amp, int64_t epochs_done, const std::string& path) {
  ampp::save(path, {{"g", gan.g},
                    {"d", gan.d},
                    {"opt_g", gan.opt_g},
                    {"opt_d", gan.opt_d},
                    {"amp", amp},
                    {"epochs_done", epochs_done}});
}

// After initialize (as apex: the model and optimizers, then the amp state); returns the epochs done.
int64_t load(Gan& gan, ampp::Amp& amp, const std::string& path) {
  int64_t epochs_done = 0;
  ampp::load(path, {{"g", gan.g},
                    {"d", gan.d},
                    {"opt_g", gan.opt_g},
                    {"opt_d", gan.opt_d},
                    {"amp", amp},
                    {"epochs_done", epochs_done}});
  return epochs_done;
}

// Whether `t` is bitwise the same on every rank (MAX and MIN of it agree).
bool same_on_every_rank(const ampp::dist::ProcessGroup& pg, const torch::Tensor& t) {
  std::vector<torch::Tensor> max{t.to(torch::kFloat64)}, min{max[0].clone()};
  pg.c10d()->allreduce(max, c10d::AllreduceOptions{c10d::ReduceOp::MAX})->wait();
  pg.c10d()->allreduce(min, c10d::AllreduceOptions{c10d::ReduceOp::MIN})->wait();
  return torch::equal(max[0], min[0]);
}

torch::Tensor flat_weights(Gan& gan) {
  std::vector<torch::Tensor> all;
  for (const auto& p : gan.g->parameters()) all.push_back(p.detach().to(torch::kFloat64).flatten());
  for (const auto& p : gan.d->parameters()) all.push_back(p.detach().to(torch::kFloat64).flatten());
  return torch::cat(all);
}

void main_worker(int rank, Args args) {
  auto pg = ampp::dist::init_process_group(
      ampp::dist::InitOptions().init_method(args.dist_url).world_size(args.nprocs).rank(rank));
  torch::manual_seed(0);  // the same initial weights on every rank
  Gan gan;
  const auto dtype = args.dtype == "fp16" ? torch::kHalf : torch::kBFloat16;
  auto amp = ampp::initialize({gan.g.ptr(), gan.d.ptr()}, {&gan.opt_g, &gan.opt_d},
                              ampp::Properties(args.opt_level).dtype(dtype).num_losses(3).verbosity(0));
  const int64_t first_epoch = args.resume ? load(gan, amp, args.checkpoint) : 0;
  ampp::dist::DistributedDataParallel g_ddp(gan.g, pg);  // after initialize, as apex
  ampp::dist::DistributedDataParallel d_ddp(gan.d, pg);
  auto data = ampp::train::make_synthetic(ampp::train::SyntheticOptions().seed(1));
  ampp::dist::DistributedSampler sampler(data.train.size(), pg);
  double err_d = 0, err_g = 0;
  for (int64_t epoch = first_epoch; epoch < args.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const auto shard = sampler.indices();
    ampp::train::BatchIterator batches(data.train, {shard.begin(), shard.end()}, args.batch_size / args.nprocs, true);
    for (int64_t step = 0; step < args.steps; ++step) {
      const auto batch = batches.next();
      if (!batch) break;
      torch::manual_seed(1000003 * epoch + 1009 * step + rank);  // each step's noise, the same after a resume
      const auto real = batch->data, noise = torch::randn({real.size(0), kNoise});
      amp.zero_grad();
      const auto fake = amp.forward(g_ddp, noise);
      const auto d_real = bce(amp.forward(d_ddp, real), 1);
      amp.scale_loss(d_real, gan.opt_d, 0).backward();  // each DDP forward followed by its backward: DDP's rule
      const auto d_fake = bce(amp.forward(d_ddp, fake.detach()), 0);
      amp.scale_loss(d_fake, gan.opt_d, 1).backward();
      amp.step(gan.opt_d);  // D alone: G's weights are the ones its forward used
      const auto g_loss = bce(amp.forward(d_ddp, fake), 1);
      amp.scale_loss(g_loss, gan.opt_g, 2).backward();
      amp.step(gan.opt_g);
      err_d = (d_real + d_fake).item<double>(), err_g = g_loss.item<double>();
    }
    if (rank == 0) {
      save(gan, amp, epoch + 1, args.checkpoint);
      fmt::print("epoch {}: loss D {:.4f} G {:.4f}, loss scales {} {} {}, checkpoint {}\n", epoch, err_d, err_g,
                 amp.loss_scale(0), amp.loss_scale(1), amp.loss_scale(2), args.checkpoint);
    }
  }
  TORCH_CHECK(std::isfinite(err_d) && std::isfinite(err_g), "rank ", rank, ": a loss is not finite");
  const auto weights = flat_weights(gan);
  TORCH_CHECK(same_on_every_rank(pg, weights), "rank ", rank, ": the weights differ across ranks");
  if (rank == 0) fmt::print("dcgan: weights checksum {:.17g}\n", weights.abs().sum().item<double>());
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"a DCGAN under one ampp::initialize, two models in DDP, resumable"};
  app.add_option("--opt-level", args.opt_level)->check(CLI::IsMember({"O1", "O2"}));
  app.add_option("--dtype", args.dtype)->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--nprocs", args.nprocs, "ranks")->check(CLI::PositiveNumber);
  app.add_option("--epochs", args.epochs, "epochs in total (also when resuming)")->check(CLI::PositiveNumber);
  app.add_option("--steps", args.steps, "steps per epoch")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", args.batch_size, "over all ranks")->check(CLI::PositiveNumber);
  app.add_option("--dist-url", args.dist_url);
  app.add_option("--checkpoint", args.checkpoint);
  app.add_flag("--resume", args.resume, "continue from --checkpoint");
  CLI11_PARSE(app, argc, argv);
  try {
    ampp::dist::spawn(main_worker, args.nprocs, args);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dcgan: {}\n", e.what());
    return 1;
  }
  return 0;
}
