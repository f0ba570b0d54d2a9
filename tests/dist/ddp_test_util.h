#pragma once
// What the DDP tests share (2 forked ranks on Gloo, checked against 1-process training on the union
// of both ranks' batches): a small MLP, per-rank batches, the reference gradients, cross-rank checks.
#include <gtest/gtest.h>

#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include <torch/torch.h>

#include <ampp/dist/ddp.h>
#include <ampp/scaling/grad_scaler.h>
#include <ampp/util/optimizer_compat.h>

#include "ampp/dist/torch_compat.h"
#include "dist/multiprocess.h"

namespace ampp_test {

inline constexpr int64_t kBatch = 8;  // per rank

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
  MlpImpl() {
    l1 = register_module("l1", torch::nn::Linear(8, 32));
    l2 = register_module("l2", torch::nn::Linear(32, 32));
    l3 = register_module("l3", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return l3(torch::relu(l2(torch::relu(l1(x))))); }
};
TORCH_MODULE(Mlp);

// The MLP with a BatchNorm between its layers: running statistics and a counter are the buffers DDP
// broadcasts every forward.
struct BnNetImpl : torch::nn::Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  BnNetImpl() {
    l1 = register_module("l1", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    l2 = register_module("l2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return l2(torch::relu(bn(l1(x)))); }
};
TORCH_MODULE(BnNet);

// Rank r builds its model from seed r + 1 (so DDP's broadcast matters); the reference model
// uses rank 0's seed.
inline Mlp make_model(int seed) {
  torch::manual_seed(seed);
  return Mlp();
}

struct Data {
  torch::Tensor x, y;
};
// Global (union) batch for step `step`; rank r uses rows [r*kBatch, (r+1)*kBatch).
inline Data global_batch(int step, int64_t world = 2) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  return {torch::randn({world * kBatch, 8}, gen, torch::kFloat), torch::randn({world * kBatch, 4}, gen, torch::kFloat)};
}
inline Data rank_batch(int step, int rank) {
  auto g = global_batch(step);
  return {g.x.narrow(0, rank * kBatch, kBatch), g.y.narrow(0, rank * kBatch, kBatch)};
}

inline torch::Tensor flat_params(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : ps) parts.push_back(p.detach().reshape(-1).to(torch::kFloat));
  return torch::cat(parts);
}
inline torch::Tensor flat_grads(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : ps) parts.push_back(p.grad().reshape(-1).to(torch::kFloat));
  return torch::cat(parts);
}

// max |a - b| / max |b|
inline double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// True if `t` is bitwise the same on every rank.
inline bool same_on_all_ranks(const ProcessGroup& pg, const torch::Tensor& t) {
  std::vector<torch::Tensor> in{t.contiguous()};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < pg.size(); ++r) out[0].push_back(torch::empty_like(in[0]));
  pg.c10d()->allgather(out, in)->wait();
  for (int r = 1; r < pg.size(); ++r)
    if (!torch::equal(out[0][r], out[0][0])) return false;
  return true;
}

// Reference: one process, mean loss over the union batch.
inline torch::Tensor reference_grads(int step_count_before, int step) {
  auto ref = make_model(1);
  torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < step_count_before; ++s) {
    opt.zero_grad();
    auto d = global_batch(s);
    torch::mse_loss(ref->forward(d.x), d.y).backward();
    opt.step();
  }
  opt.zero_grad();
  auto d = global_batch(step);
  torch::mse_loss(ref->forward(d.x), d.y).backward();
  return flat_grads(ref->parameters());
}

struct Trace {
  std::vector<torch::Tensor> grads;  // flat, after each synchronised backward
  torch::Tensor params;              // flat, after the last step
};

// Three SGD-with-momentum steps through DDP, optimizer.zero_grad() before each; step 0 first
// accumulates a micro-batch under no_sync().
inline Trace train_steps(const ProcessGroup& pg, int rank, const DistributedDataParallelOptions& options,
                         std::optional<BuiltinCommHook> hook) {
  auto model = make_model(rank + 1);
  DistributedDataParallel ddp(model, pg, options);
  if (hook) ddp.register_builtin_comm_hook(*hook);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Trace trace;
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    if (step == 0) {
      auto guard = ddp.no_sync();
      auto d = rank_batch(5, rank);
      torch::mse_loss(ddp->forward(d.x), d.y).backward();
    }
    auto d = rank_batch(step, rank);
    torch::mse_loss(ddp->forward(d.x), d.y).backward();
    trace.grads.push_back(flat_grads(model->parameters()));
    opt.step();
  }
  trace.params = flat_params(model->parameters());
  return trace;
}

}  // namespace ampp_test

// The DDP test files use these names unqualified.
using namespace ampp::dist;
using namespace ampp_test;
using namespace ampp_test;
using namespace std::chrono_literals;
