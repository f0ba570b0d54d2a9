#pragma once
// What the FSDP tests share: a small residual stack whose blocks are the sharding units (row counts
// that do not divide by 2 or 3 ranks, so the shards are padded), entered through unit_forward or not.
#include <torch/torch.h>

#include <ampp/dist/fully_shard.h>

#include <memory>
#include <string>
#include <vector>

namespace ampp_test {

struct StackBlockImpl : torch::nn::Module {
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
  StackBlockImpl() {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({12})));
    up = register_module("up", torch::nn::Linear(12, 13));
    down = register_module("down", torch::nn::Linear(13, 12));
  }
  torch::Tensor forward(torch::Tensor x) { return x + down(torch::relu(up(norm(x)))); }
};
TORCH_MODULE(StackBlock);

struct StackImpl : torch::nn::Module {
  torch::nn::Linear in{nullptr}, head{nullptr};
  std::vector<StackBlock> blocks;
  bool through_units;  // enter the blocks through ampp::dist::unit_forward
  explicit StackImpl(bool units = true) : through_units(units) {
    in = register_module("in", torch::nn::Linear(8, 12));
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), StackBlock()));
    head = register_module("head", torch::nn::Linear(12, 5));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = in(x);
    for (auto& block : blocks) x = through_units ? ampp::dist::unit_forward(block, x) : block(x);
    return head(x);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() const {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (const auto& b : blocks) out.push_back(b.ptr());
    return out;
  }
};
TORCH_MODULE(Stack);

inline Stack make_stack(int seed, bool units = true) {
  torch::manual_seed(seed);
  return Stack(units);
}

// Every parameter of a full state dict, in named_parameters() order of `model`, flattened.
inline torch::Tensor flat_state(const ampp::StateDict& state, const torch::nn::Module& model) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : model.named_parameters()) parts.push_back(state.at(p.key()).toTensor().reshape(-1));
  return torch::cat(parts);
}

}  // namespace ampp_test
