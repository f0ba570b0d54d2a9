#pragma once
// Internal to ampp: what a FullyShardedDataParallel holds (fully_shard.h): its sharded parameters, its
// units (0: the root's own parameters) and the bookkeeping of one forward and backward.
#include <memory>
#include <string>
#include <vector>

#include "fsdp_unit.h"

namespace ampp::dist::detail {

class FsdpState {
 public:
  FsdpState(std::shared_ptr<torch::nn::Module> root, const FullyShardOptions& options);
  ~FsdpState();
  FsdpState(const FsdpState&) = delete;
  FsdpState& operator=(const FsdpState&) = delete;

  // Cuts every parameter of root into this rank's shard and groups them into units.
  void shard_parameters(const std::vector<std::shared_ptr<torch::nn::Module>>& unit_modules);
  // Makes unit_forward find the units by their modules.
  void register_units(const std::vector<std::shared_ptr<torch::nn::Module>>& unit_modules);
  // FullyShardOptions::shared_memory: every rank on this machine and on the CPU (a collective).
  void use_shared_memory_if_local();
  void pre_root_forward();
  // The engine's end-of-backward callback: what the units did not reduce yet, then every unit resharded.
  void end_backward();
  // Where the shards live (the first one's device; the CPU without parameters): the device of the small
  // tensors FSDP's own checks send through an NCCL group (control_tensors.h).
  torch::Device shard_device() const {
    return params.empty() ? torch::Device(torch::kCPU) : params.front().padded.device();
  }

  std::shared_ptr<torch::nn::Module> root;
  FsdpContext context;
  std::vector<ShardedParam> params;  // named_parameters() order; reserved, never reallocated
  std::vector<std::shared_ptr<FsdpUnit>> units;
  std::vector<const torch::nn::Module*> registered;
  bool forwarded = false;
  bool callback_queued = false;

 private:
  ShardedParam make_sharded(const std::string& name, const torch::Tensor& param, c10::ScalarType gathered);
  void install_gradient_hooks(const std::shared_ptr<FsdpUnit>& unit);
};

}  // namespace ampp::dist::detail
