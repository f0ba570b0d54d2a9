#pragma once
// Internal to ampp::dist: the device of the small tensors that ampp's own bookkeeping collectives send
// (counts, flags, a bucket order, serialised bytes). A Gloo group takes CPU tensors (and CUDA ones,
// through the host); an NCCL group takes CUDA tensors only, on the GPU of the data it serves, which is
// each rank's own. PyTorch's reducer does the same: its model check and bucket order travel on the
// parameters' device (verify_params_across_processes, sync_bucket_indices).
#include <ampp/dist/process_group.h>
#include <torch/types.h>

#include <vector>

namespace ampp::dist::detail {

// `data_device`: where the tensors the group reduces live (a module's parameters, a batch).
inline torch::Device control_device(const ProcessGroup& group, const torch::Device& data_device) {
  return group.backend() == "nccl" ? data_device : torch::Device(torch::kCPU);
}

inline torch::Device control_device(const ProcessGroup& group, const std::vector<torch::Tensor>& data) {
  return control_device(group, data.empty() ? torch::Device(torch::kCPU) : data.front().device());
}

}  // namespace ampp::dist::detail
