// Same-run comparison of glibc's default allocator behaviour against
// ampp::train::retain_freed_memory() on one training step of the reference models (FP32, SGD with
// momentum, batch 256, 1 thread). Each measurement runs in its own forked child, because the
// allocator setting is per process and cannot be undone; the two settings alternate over rounds and
// each keeps its best median, so a noisy moment does not decide the ratio.
//
//   ampp_bench_process_setup [steps=40] [rounds=3]
#include <ampp/train/allocator.h>
#include <ampp/train/models.h>
#include <ampp/util/threads.h>

#include <fmt/core.h>
#include <torch/torch.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// Median milliseconds of `steps` training steps, in this (child) process.
double median_step_ms(const std::string& model_name, bool retain, int steps) {
  if (retain) ampp::train::retain_freed_memory();
  ampp::set_compute_threads(1);
  torch::manual_seed(0);
  auto model = ampp::train::make_model(model_name);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const auto x = torch::randn({256, 1, 28, 28});
  const auto y = torch::randint(10, {256}, torch::kLong);
  auto step = [&] {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

// Runs median_step_ms in a forked child and returns its result (negative on failure).
double in_child(const std::string& model_name, bool retain, int steps) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const double ms = median_step_ms(model_name, retain, steps);
    const ssize_t written = write(fds[1], &ms, sizeof ms);
    _exit(written == sizeof ms ? 0 : 1);
  }
  close(fds[1]);
  double ms = -1;
  if (pid < 0 || read(fds[0], &ms, sizeof ms) != sizeof ms) ms = -1;
  close(fds[0]);
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 40;
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
  fmt::print("training step (fp32, batch 256, 1 thread), best median of {} rounds x {} steps\n\n", rounds, steps);
  fmt::print("{:<6} {:>22} {:>26} {:>10}\n", "model", "glibc default (ms)", "retain_freed_memory (ms)", "speed-up");
  bool ok = true;
  for (const std::string model : {"mlp", "cnn"}) {
    double plain = 1e300, retained = 1e300;
    for (int r = 0; r < rounds; ++r) {
      const double a = in_child(model, false, steps), b = in_child(model, true, steps);
      ok = ok && a > 0 && b > 0;
      plain = std::min(plain, a);
      retained = std::min(retained, b);
    }
    fmt::print("{:<6} {:>22.2f} {:>26.2f} {:>9.2f}x\n", model, plain, retained, plain / retained);
  }
  return ok ? 0 : 1;
}
