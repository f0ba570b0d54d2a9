// The README's training loop, as it is there, built and run by CI (tests/examples: two ranks under
// `ampp run --nproc-per-node 2`), plus the lines marked "check" that the README leaves out. Exits 1 unless
// the loss fell. argv[1]: the checkpoint's path (the README's "run.pt").
#include <ampp/ampp.h>

#include <cstdio>
#include <filesystem>
#include <string>

int main(int argc, char** argv) {
  const std::string checkpoint = argc > 1 ? argv[1] : "run.pt";
  double first = -1, last = -1;                // check
  auto pg = ampp::dist::init_process_group();  // env:// as set by `ampp run --nproc-per-node 2 -- ./train` or torchrun
  auto data = ampp::train::make_synthetic();   // or ampp::train::load_mnist_folder(dir)
  auto model = ampp::train::make_model("cnn");
  ampp::dist::DistributedDataParallel ddp(model, pg);  // rank 0's weights on every rank
  ampp::dist::DistributedSampler sampler(data.train.size(), pg);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  ampp::GradScaler scaler;  // 2^16, x2 after 2000 good steps, x0.5 on inf/NaN
  int64_t start = 0;        // resume where an earlier run stopped
  if (std::filesystem::exists(checkpoint))
    ampp::load(checkpoint, {{"model", ddp}, {"optimizer", opt}, {"scaler", scaler}, {"epoch", start}});
  for (int64_t epoch = start; epoch < 3; ++epoch) {
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
      last = loss.item<double>(), first = first < 0 ? last : first;  // check
    }
    int64_t next = epoch + 1;  // rank 0 writes, atomically; Python's torch.load opens it
    ampp::save(checkpoint, {{"model", ddp}, {"optimizer", opt}, {"scaler", scaler}, {"epoch", next}});
  }
  std::printf("rank %d: loss %.4f -> %.4f\n", pg.rank(), first, last);  // check
  return last < first ? 0 : 1;                                          // check
}
