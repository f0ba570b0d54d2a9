#pragma once
// SyncBatchNorm on any c10d backend (Gloo on CPU included): in training, the batch statistics are
// those of the whole batch across the ranks of a group, as PyTorch's torch.nn.SyncBatchNorm (which
// runs only on GPUs). A drop-in for torch::nn::BatchNorm{1,2,3}d:
//
//   struct Net : torch::nn::Module {
//     ampp::dist::SyncBatchNorm bn{ampp::dist::SyncBatchNormOptions(16)};   // any input (N, C, ...)
//   };
//
// Without a process group (none given and none initialised), with one rank, or in eval(), it is
// plain BatchNorm: the same model code runs in one process and in many.
//
// What it does (PyTorch's algorithm, with a stabler merge):
//   forward   each rank computes its per-channel mean, biased variance and count (float32 for
//             bf16/fp16 inputs); one allgather; every rank merges them with Chan's formula in double
//             (no E[x^2] - E[x]^2 cancellation, unequal per-rank counts and empty ranks included),
//             normalises its own part and updates the running statistics identically.
//   backward  sum(dy) and sum(dy * (x - mean)) are allreduced (one collective), then each rank
//             computes its input gradient. The weight and bias gradients stay local: DDP averages them.
// Every rank of the group must call forward and backward the same number of times (collectives).
#include <optional>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <ampp/dist/process_group.h>
#include <ampp/util/batch_norm_like.h>

namespace ampp::dist {

struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(int64_t num_features) : num_features_(num_features) {}
  // C of the (N, C, ...) inputs.
  TORCH_ARG(int64_t, num_features);
  TORCH_ARG(double, eps) = 1e-5;
  // Weight of the batch statistics in the running ones; nullopt: cumulative average (PyTorch's None).
  TORCH_ARG(std::optional<double>, momentum) = 0.1;
  // Learnable per-channel weight and bias.
  TORCH_ARG(bool, affine) = true;
  // Keep running statistics (used by eval()); without them eval() normalises with batch statistics.
  TORCH_ARG(bool, track_running_stats) = true;
  // The ranks whose batches are pooled; empty: the default group (init_process_group) if any.
  TORCH_ARG(ProcessGroup, process_group) = {};
};

// Parameters and buffers have BatchNorm's names (weight, bias, running_mean, running_var,
// num_batches_tracked), so state dicts match torch.nn.SyncBatchNorm's and BatchNorm's.
// BatchNormLike: O2 keeps it in FP32 like BatchNorm.
class SyncBatchNormImpl : public torch::nn::NormImplBase<1, SyncBatchNormImpl, SyncBatchNormOptions>,
                          public BatchNormLike {
 public:
  explicit SyncBatchNormImpl(const SyncBatchNormOptions& options)
      : torch::nn::NormImplBase<1, SyncBatchNormImpl, SyncBatchNormOptions>(options) {}
  SyncBatchNormImpl(int64_t num_features) : SyncBatchNormImpl(SyncBatchNormOptions(num_features)) {}

  // input: (N, C, ...) with C == num_features; N may differ between ranks, and be 0 on some.
  torch::Tensor forward(const torch::Tensor& input);

  // The group forward() would synchronise over now, or an empty handle (then it is plain BatchNorm).
  ProcessGroup sync_group() const;

  void pretty_print(std::ostream& stream) const override;
  bool is_affine() const override { return options.affine(); }

 protected:
  void _check_input_dim(const torch::Tensor& input) override;
};
TORCH_MODULE(SyncBatchNorm);

// While one is alive on this thread, SyncBatchNorm uses this rank's batch statistics only and calls
// no collective: for a forward that only this rank runs (the numerics doctor's replay), which would
// otherwise wait forever for the others. Nests.
class [[nodiscard]] LocalBatchNormGuard {
 public:
  LocalBatchNormGuard();
  ~LocalBatchNormGuard();
  LocalBatchNormGuard(const LocalBatchNormGuard&) = delete;
  LocalBatchNormGuard& operator=(const LocalBatchNormGuard&) = delete;
  static bool active();
};

// The synchronised batch norm itself, differentiable in input, weight and bias (what
// SyncBatchNorm::forward calls in training with more than one rank). running_mean/running_var may
// be undefined (not tracked); weight/bias may be undefined (affine off).
torch::Tensor sync_batch_norm(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                              const torch::Tensor& running_mean, const torch::Tensor& running_var, double momentum,
                              double eps, const ProcessGroup& group);

}  // namespace ampp::dist
