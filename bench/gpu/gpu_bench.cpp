// ampp's side of the GPU benchmark (bench/gpu/compare.py runs it beside bench/gpu/python_side.py, which
// trains the same model the same way in Python PyTorch): one model, one precision, synthetic data, and
// one JSON line: items (images or tokens) per second, ms per step, the peak of allocated GPU memory
// (what torch.cuda.max_memory_allocated counts), the last loss and, with --profile-steps, the kernels
// that took the most time in that many steps. The steps are timed in rounds of --steps until
// --min-seconds have passed, and the median round counts (as python_side.py does).
//
//   build/bench/gpu/ampp_gpu_bench --model cnn --precision bf16 [--channels-last] [--cuda-graphs]
//   build/bench/gpu/ampp_gpu_bench --serve   # one case per line on stdin ({"model": ..., flags without
//                                            # dashes}), one result line each; {"query": "libraries"}
//                                            # answers which CUDA libraries the process loaded
//
// Precisions: fp32; tf32 (TF32 matmuls and convolutions); fp16 (autocast + GradScaler, O1); bf16
// (autocast, O1); o2-fp16 and o2-bf16 (ampp::initialize O2: the model cast, FP32 masters). The optimizer
// is fused: FusedSGD (momentum 0.9) for the conv nets, FusedAdamW for the GPTs, as PyTorch's fused=True.
// --fp8 RECIPE (bf16 precisions, GPTs): the Linear layers that --fp8-layers takes run their products in
// float8 (ampp::convert_to_float8_training; Python: torchao's). --model gpt2-xl: GPT-2 XL's shapes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <ampp/amp/initialize.h>
#include <ampp/precision/autocast.h>
#include <ampp/precision/float8_linear.h>
#include <ampp/scaling/cuda_graph_step.h>
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/scaling/grad_scaler.h>
#include <ampp/train/gpt.h>

#include "gpu_memory.h"
#include "kernel_profile.h"
#include "loaded_libraries.h"
#include "resnet50.h"

namespace {

struct BenchOptions {
  std::string model = "cnn", precision = "fp32", device = "cuda";
  std::string fp8, fp8_layers = "auto";  // a GPT's Linear products in float8: the recipe ("" none), which layers
  int64_t batch = 0, steps = 30, warmup = 10, context = 0, profile_steps = 0;
  double min_seconds = 1.0;
  bool channels_last = false, cuda_graphs = false;
};

// The model and one synthetic batch on the device; `items` per batch: images, or tokens for a GPT.
struct Workload {
  std::shared_ptr<ampp::train::ClassifierImpl> model;
  torch::Tensor x, y;
  int64_t items = 0;
  bool is_gpt = false;
};

// GPT-2 XL's shapes (1.5B parameters), issue 42's size where fp8 pays: a benchmark model, not a preset of
// `ampp train`. python_side.py builds the same.
ampp::train::GptOptions gpt_options(const std::string& model) {
  if (model == "gpt2-xl") return ampp::train::gpt_preset("gpt2-124m").n_layer(48).n_head(25).n_embd(1600);
  return ampp::train::gpt_preset(model);
}

// --fp8: the GPT's Linear layers that the filter takes run their products in float8 (float8_linear.h).
void convert_to_fp8(const BenchOptions& o, ampp::train::ClassifierImpl& model) {
  if (o.fp8.empty()) return;
  TORCH_CHECK(o.fp8_layers == "auto" || o.fp8_layers == "all", "--fp8-layers '", o.fp8_layers, "': auto or all");
  const auto config = ampp::Float8LinearConfig::from_recipe_name(o.fp8);
  ampp::convert_to_float8_training(
      model, config,
      o.fp8_layers == "all" ? ampp::fits_fp8_kernels_filter() : ampp::auto_filter_for_recipe(config.recipe()));
}

Workload make_workload(const BenchOptions& o, const torch::Device& device) {
  torch::manual_seed(0);
  Workload w;
  TORCH_CHECK(o.fp8.empty() || ampp::train::is_gpt(o.model) || o.model == "gpt2-xl", "--fp8: a GPT's Linear layers; ",
              o.model, " has none");
  TORCH_CHECK(o.fp8.empty() || o.precision == "bf16" || o.precision == "o2-bf16",
              "--fp8 keeps the rest of the model in bf16: --precision bf16 or o2-bf16, got ", o.precision);
  if (ampp::train::is_gpt(o.model) || o.model == "gpt2-xl") {
    auto g = gpt_options(o.model);
    if (o.context > 0) g.context(o.context);
    const int64_t batch = o.batch > 0 ? o.batch : 8;
    w.model = ampp::train::make_gpt(g);
    convert_to_fp8(o, *w.model);
    w.x = torch::randint(0, g.vocab_size(), {batch, g.context()}, torch::kLong);
    w.y = torch::randint(0, g.vocab_size(), {batch, g.context()}, torch::kLong);
    w.items = batch * g.context();
    w.is_gpt = true;
  } else if (o.model == "resnet50") {
    const int64_t batch = o.batch > 0 ? o.batch : 128;
    w.model = ampp::bench::make_resnet50(1000, o.channels_last);
    w.x = torch::randn({batch, 3, 224, 224});
    w.y = torch::randint(0, 1000, {batch}, torch::kLong);
    w.items = batch;
  } else {
    TORCH_CHECK(o.model == "cnn", "unknown --model '", o.model, "': cnn, resnet50 or a GPT preset (gpt2-124m, ...)");
    const int64_t batch = o.batch > 0 ? o.batch : 256;
    w.model = ampp::train::make_model("cnn", ampp::train::ModelOptions().channels_last(o.channels_last));
    w.x = torch::randn({batch, 1, 28, 28});
    w.y = torch::randint(0, 10, {batch}, torch::kLong);
    w.items = batch;
  }
  w.model->to(device);
  w.x = w.x.to(device);
  w.y = w.y.to(device);
  return w;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Workload& w) {
  if (w.is_gpt)
    return std::make_unique<ampp::FusedAdamW>(w.model->parameters(),
                                              torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
  return std::make_unique<ampp::FusedSGD>(w.model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
}

// Cross-entropy over every position: autocast computes it in float32, as in Python.
torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& y) {
  return torch::cross_entropy_loss(logits.flatten(0, logits.dim() - 2), y.flatten());
}

c10::ScalarType low_precision(const std::string& precision) {
  return precision.find("fp16") != std::string::npos ? torch::kHalf : torch::kBFloat16;
}

// One training step as a function of the batch tensors in the Workload (static: a CUDA graph reads them).
struct Trainer {
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<ampp::GradScaler> scaler;
  std::unique_ptr<ampp::Amp> amp;
  std::function<torch::Tensor()> step;
};

// The steps capture the Trainer by address: it lives behind the unique_ptr, where it stays.
std::unique_ptr<Trainer> make_trainer(const BenchOptions& o, Workload& w, const torch::Device& device) {
  auto trainer = std::make_unique<Trainer>();
  Trainer& t = *trainer;
  t.opt = make_optimizer(w);
  const auto& p = o.precision;
  if (p == "fp32" || p == "tf32") {
    t.step = [&w, tr = &t] {
      tr->opt->zero_grad();
      auto loss = loss_of(w.model->forward(w.x), w.y);
      loss.backward();
      tr->opt->step();
      return loss.detach();
    };
  } else if (p == "fp16" || p == "bf16") {
    if (p == "fp16") t.scaler = std::make_unique<ampp::GradScaler>();
    t.step = [&w, tr = &t, dtype = low_precision(p), type = device.type()] {
      tr->opt->zero_grad();
      torch::Tensor loss;
      {
        ampp::autocast region(type, dtype);
        loss = loss_of(w.model->forward(w.x), w.y);
      }
      if (!tr->scaler) {
        loss.backward();
        tr->opt->step();
        return loss.detach();
      }
      tr->scaler->scale(loss).backward();
      tr->scaler->step(*tr->opt);
      tr->scaler->update();
      return loss.detach();
    };
  } else {
    TORCH_CHECK(p == "o2-fp16" || p == "o2-bf16", "unknown --precision '", p,
                "': fp32, tf32, fp16, bf16, o2-fp16 or o2-bf16");
    t.amp = std::make_unique<ampp::Amp>(
        ampp::initialize(w.model, *t.opt, ampp::Properties("O2").cast_model_type(low_precision(p))));
    t.step = [&w, tr = &t] {
      tr->opt->zero_grad();
      auto loss = loss_of(tr->amp->forward(w.model, w.x), w.y);
      tr->amp->scale_loss(loss).backward();
      tr->amp->step();
      return loss.detach();
    };
  }
  return trainer;
}

int64_t parameter_count(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// Rounds of o.steps steps, each timed from a synchronised device to a synchronised device, until
// o.min_seconds have passed (one round at least). The median round's time stands for the case: a
// launch-bound step of 2 ms is otherwise at the mercy of one hiccup of the host. `spread`: (slowest -
// fastest) / median, how much the rounds disagreed.
struct Rounds {
  double median_s = 0, spread = 0;
  int64_t count = 0;
};

Rounds time_rounds(const std::function<torch::Tensor()>& step, torch::Tensor& loss, const torch::Device& device,
                   const BenchOptions& o) {
  std::vector<double> times;
  double total = 0;
  synchronize(device);
  while (times.empty() || total < o.min_seconds) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < o.steps; ++s) loss = step();
    synchronize(device);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    total += times.back();
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  return {median, (times.back() - times.front()) / median, static_cast<int64_t>(times.size())};
}

nlohmann::json run(const BenchOptions& o) {
  const torch::Device device(o.device);
  TORCH_CHECK(!device.is_cuda() || torch::cuda::is_available(), "--device ", o.device,
              ": no CUDA device visible. Fix: run on a machine with a GPU, or --device cpu.");
  at::globalContext().setBenchmarkCuDNN(true);  // both sides: cuDNN picks its fastest kernels per shape
  at::globalContext().setAllowTF32CuBLAS(o.precision == "tf32");
  at::globalContext().setAllowTF32CuDNN(o.precision == "tf32");
  Workload w = make_workload(o, device);
  const auto trainer = make_trainer(o, w, device);
  std::function<torch::Tensor()> step = trainer->step;
  std::unique_ptr<ampp::CudaGraphStep> graph;
  if (o.cuda_graphs) {
    graph = std::make_unique<ampp::CudaGraphStep>(std::vector<torch::Tensor>{w.x, w.y}, trainer->step);
    step = [&] { return (*graph)({w.x, w.y}); };
  }
  ampp::bench::reset_peak_gpu_memory(device);
  torch::Tensor loss;
  for (int64_t s = 0; s < o.warmup; ++s) loss = step();
  const Rounds rounds = time_rounds(step, loss, device, o);
  const double seconds = rounds.median_s;
  const double peak_mib = ampp::bench::peak_gpu_memory_mib(device);
  nlohmann::json kernels;
  if (o.profile_steps > 0) {
    kernels = ampp::bench::profile_kernels(
        [&] {
          for (int64_t s = 0; s < o.profile_steps; ++s) loss = step();
          synchronize(device);
        },
        device, 20);
    kernels["steps"] = o.profile_steps;
  }
  return {{"side", "ampp"},
          {"model", o.model},
          {"precision", o.precision},
          {"fp8", o.fp8},
          {"channels_last", o.channels_last},
          {"cuda_graphs", o.cuda_graphs},
          {"batch", w.x.size(0)},
          {"items_per_step", w.items},
          {"items_per_s", static_cast<double>(w.items * o.steps) / seconds},
          {"ms_per_step", 1e3 * seconds / o.steps},
          {"rounds", rounds.count},
          {"spread", rounds.spread},
          {"peak_mib", peak_mib},
          {"kernels", kernels},
          {"loss", loss.item<double>()},
          {"parameters", parameter_count(*w.model)},
          {"device", o.device}};
}

// A case from a --serve line: the command line's option names, without the dashes.
BenchOptions options_from(const nlohmann::json& j) {
  BenchOptions o;
  o.model = j.value("model", o.model);
  o.precision = j.value("precision", o.precision);
  o.fp8 = j.value("fp8", o.fp8);
  o.fp8_layers = j.value("fp8_layers", o.fp8_layers);
  o.device = j.value("device", o.device);
  o.batch = j.value("batch", o.batch);
  o.steps = j.value("steps", o.steps);
  o.warmup = j.value("warmup", o.warmup);
  o.context = j.value("context", o.context);
  o.profile_steps = j.value("profile_steps", o.profile_steps);
  o.min_seconds = j.value("min_seconds", o.min_seconds);
  o.channels_last = j.value("channels_last", o.channels_last);
  o.cuda_graphs = j.value("cuda_graphs", o.cuda_graphs);
  return o;
}

// One case's line, or its error: a case that fails says why and the process goes on.
nlohmann::json run_or_error(const BenchOptions& o) {
  try {
    return run(o);
  } catch (const c10::Error& e) {
    return {{"side", "ampp"}, {"error", e.what_without_backtrace()}};
  } catch (const std::exception& e) {
    return {{"side", "ampp"}, {"error", e.what()}};
  }
}

// compare.py's long-lived process: the CUDA context, cuBLAS and cuDNN are set up once for every case.
int serve() {
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    nlohmann::json out;
    try {
      const auto request = nlohmann::json::parse(line);
      if (request.value("query", "") == "libraries")
        out = {{"side", "ampp"}, {"libraries", ampp::bench::loaded_cuda_libraries()}};
      else
        out = run_or_error(options_from(request));
    } catch (const nlohmann::json::exception& e) {
      out = {{"side", "ampp"}, {"error", std::string("not a case: ") + e.what()}};
    }
    ampp::bench::release_cached_gpu_memory();  // the next case, or the other side, starts from an empty cache
    std::cout << out.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  bool serve_mode = false;
  CLI::App app{"ampp's side of the GPU benchmark: one JSON line per run (bench/gpu/compare.py)"};
  app.add_flag("--serve", serve_mode, "read cases from stdin, one JSON object a line; answer one line each");
  app.add_option("--model", o.model, "cnn, resnet50, a GPT preset (gpt2-124m, gpt-mini, gpt-tiny), or gpt2-xl");
  app.add_option("--precision", o.precision, "fp32, tf32, fp16, bf16, o2-fp16, o2-bf16");
  app.add_option("--batch", o.batch, "batch size (0: 256 cnn, 128 resnet50, 8 GPT)");
  app.add_option("--context", o.context, "GPT sequence length (0: the preset's)");
  app.add_option("--steps", o.steps, "timed steps");
  app.add_option("--warmup", o.warmup, "untimed steps first");
  app.add_option("--min-seconds", o.min_seconds, "time rounds of --steps until this much time has passed");
  app.add_option("--profile-steps", o.profile_steps, "then profile this many steps: the top kernels (0: none)");
  app.add_option("--device", o.device, "cuda, cuda:N or cpu");
  app.add_option("--fp8", o.fp8, "a GPT's Linear products in float8 under bf16: tensorwise, rowwise or delayed");
  app.add_option("--fp8-layers", o.fp8_layers, "with --fp8: auto (torchao's filter) or all (sizes multiples of 16)");
  app.add_flag("--channels-last", o.channels_last, "conv nets: NHWC activations");
  app.add_flag("--cuda-graphs", o.cuda_graphs, "capture the step once and replay it (ampp::CudaGraphStep)");
  CLI11_PARSE(app, argc, argv);
  if (serve_mode) return serve();
  const auto out = run_or_error(o);
  if (out.contains("error")) {
    std::fprintf(stderr, "ampp_gpu_bench: %s\n", out["error"].get<std::string>().c_str());
    return 1;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
