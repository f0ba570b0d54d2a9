// The README's training loop, as it is there, built and run by CI (tests/examples: two ranks under
// `ampp run --nproc-per-node 2`). Exits 1 unless the loss fell.
#include <ampp/ampp.h>

#include <cstdio>

int main() {
  // ---- README begin ----
  auto pg = ampp::dist::init_process_group();  // env:// as set by `ampp run --nproc-per-node 2 -- ./train` or torchrun
  auto data = ampp::train::make_synthetic();   // or ampp::train::load_mnist_folder(dir)
  auto model = ampp::train::make_model("cnn");
  ampp::dist::DistributedDataParallel ddp(model, pg);  // rank 0's weights on every rank
  ampp::dist::DistributedSampler sampler(data.train.size(), pg);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  ampp::GradScaler scaler;  // 2^16, x2 after 2000 good steps, x0.5 on inf/NaN
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.set_epoch(epoch);
    auto shard = sampler.indices();
    ampp::train::BatchIterator batches(data.train, {shard.begin(), shard.end()}, 64, /*drop_last=*/true);
    while (auto batch = batches.next()) {
      opt.zero_grad();
      auto loss = [&] {
        ampp::autocast guard(torch::kCPU, torch::kHalf);  // fp16 (emulated on CPU) until the guard ends
        return torch::nn::functional::cross_entropy(ddp.forward(batch->data), batch->target);
      }();
      scaler.scale(loss).backward();  // DDP averages the gradients over the ranks
      scaler.step(opt);               // unscales first; skipped on inf/NaN
      scaler.update();
      // ---- README end ----
      static double first = loss.item<double>();
      if (epoch == 2 && batches.position() == batches.num_batches()) {
        std::printf("rank %d: loss %.4f -> %.4f\n", pg.rank(), first, loss.item<double>());
        return loss.item<double>() < first ? 0 : 1;
      }
    }
  }
  return 1;
}
