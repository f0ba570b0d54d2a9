#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// What the tensors of a training run hold, by kind, and what lies between them and the process's
// peak: `ampp train --profile` prints it and summary.json keeps it (`memory_bytes`), so that a peak
// RSS explains itself (weights, FP32 masters, gradients, optimizer state, data, activations, and
// what is not a tensor at all).
#include <ampp/train/dataset.h>
#include <ampp/util/tensor_memory.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace ampp::train {

// Bytes of distinct tensor storages (a storage shared by several tensors, e.g. DDP's gradient
// buckets, counts once), on one rank.
struct MemoryReport {
  // At rest, after the last training step:
  int64_t weights = 0;          // the model's parameters and buffers, in their own dtypes
  int64_t masters = 0;          // parameters the optimizer steps that are not the model's (O2's FP32 masters)
  int64_t gradients = 0;        // the gradients of both, and buffers kept for them between steps
  int64_t optimizer_state = 0;  // momentum, moments (ZeRO: this rank's shard)
  int64_t data = 0;             // the training and test sets as held in this process's memory
  int64_t mapped_data = 0;      // their images mapped from files (resident pages; the page cache's, shared by
                                // the machine's workers; part of file_backed)
  int64_t other_tensors = 0;    // every other live tensor the tracker counts
  // Peaks over the run (the tracker counts tensors created after it was installed):
  int64_t tensors_at_rest = 0;  // all live tensors at rest (tracker)
  int64_t tensor_peak = 0;      // all tensors at their peak (tracker); minus tensors_at_rest: activations
                                // and temporaries of the steps and evaluations
  int64_t process_peak = 0;     // peak RSS; minus tensor_peak: what is not a tensor, of which
  int64_t file_backed = 0;      // resident pages of mapped files at the end (RssFile): mapped data and the
                                // libraries' code as far as it ran (bf16 kernels page in code fp32 never touches)

  int64_t activations_and_temporaries() const { return tensor_peak - tensors_at_rest; }
  int64_t outside_tensors() const { return process_peak - tensor_peak; }
  int64_t library_code() const { return std::max<int64_t>(0, file_backed - mapped_data); }
  // Allocator slack, the kernels' own scratch (oneDNN), stacks, the runtime's heap.
  int64_t other_anonymous() const { return outside_tensors() - file_backed; }
};

// The parameters `optimizer` steps (O2: the masters), the state `state_owner` holds for them (the
// same optimizer, or ZeRO's local shard optimizer), and `gradient_buffers` kept outside any .grad
// (Amp::master_gradient_buffers). Throws for an optimizer state type it cannot read.
MemoryReport measure_memory(const torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                            torch::optim::Optimizer& state_owner, const std::vector<torch::Tensor>& gradient_buffers,
                            const DatasetPair& data, const TensorMemoryTracker& tracker);

// One row per kind, MiB and share of the process peak.
std::string memory_table(const MemoryReport& report);

}  // namespace ampp::train
