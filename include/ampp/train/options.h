#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// TrainOptions: everything `ampp train` can be told, with its defaults (written once, here), checked by
// validate() (src/ampp/train/options.cpp), and the paths and defaults derived from it.
#include <ampp/amp/opt_level.h>
#include <ampp/amp/properties.h>
#include <ampp/precision/float8.h>

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ampp::train {

// The optimizer: SGD with momentum as the seeds use it, or AdamW as nanoGPT trains a GPT: betas (0.9, 0.95),
// eps 1e-8, decoupled weight decay on the matrices only (no decay on biases, LayerNorm and BatchNorm
// weights: every parameter of fewer than 2 dimensions).
enum class OptimizerKind { kSgd, kAdamW };
// kStep: StepLR (lr_step, lr_gamma; constant when lr_step is 0). kCosine: nanoGPT's get_lr, a cosine
// from lr down to lr / 10 over lr_decay_steps optimizer steps after the warmup, then lr / 10.
enum class LrSchedule { kStep, kCosine };

// Where the host reads the steps' results (Note [what the host reads], src/ampp/train/run.h). kAuto: after
// every step on the CPU, where a read costs nothing and each skipped step gets its own record; at log points
// on a GPU, where each read waits for the GPU. kLogPoints on the CPU previews a GPU run's reads (its tests'
// way); kEveryStep on a GPU waits for the GPU after each step. The doctor reads every step.
enum class HostReads { kAuto, kEveryStep, kLogPoints };

OptimizerKind parse_optimizer_kind(const std::string& text);  // "sgd" or "adamw"
std::string to_string(OptimizerKind kind);
LrSchedule parse_lr_schedule(const std::string& text);  // "step" or "cosine"
std::string to_string(LrSchedule schedule);
HostReads parse_host_reads(const std::string& text);  // "auto", "every-step" or "log-points"

struct TrainOptions {
  // mlp, cnn, resnet (images) or gpt-tiny, gpt-mini, gpt2-124m (text; gpt.h).
  TORCH_ARG(std::string, model) = "cnn";
  // "" = the model's default: Fashion-MNIST from dataset-fashion-mnist for images, the text of Debian's
  // fortunes package for a GPT. Or "synthetic[:N]", an MNIST-format folder, "text:FILE" (a file or folder).
  TORCH_ARG(std::string, data) = "";
  // GPTs: tokens per sequence and the sizes (ModelOptions); 0 = the preset's.
  TORCH_ARG(int64_t, context) = 0;
  TORCH_ARG(int64_t, n_layer) = 0;
  TORCH_ARG(int64_t, n_head) = 0;
  TORCH_ARG(int64_t, n_embd) = 0;
  TORCH_ARG(OptLevel, opt_level) = OptLevel::O1;
  // The low-precision dtype of O1-O3: kHalf (fp16, emulated on CPU) or kBFloat16.
  TORCH_ARG(c10::ScalarType, dtype) = c10::ScalarType::Half;
  // fp8 training (`--dtype fp8`): the GPT's Linear layers run their products in float8 with this recipe
  // (ampp::float8_linear, torchao's), everything else in `dtype` (bf16). By default only the layers whose
  // shapes torchao measured fp8 to pay on (ampp::auto_filter_for_recipe: none of gpt2-124m's 768-wide ones);
  // fp8_all_layers: every one whose sizes are multiples of 16. O1 and O2.
  TORCH_ARG(std::optional<Float8Recipe>, fp8) = std::nullopt;
  TORCH_ARG(bool, fp8_all_layers) = false;
  // The delayed recipe's amax history: the passes each scale is computed from (TransformerEngine's
  // amax_history_len; its default).
  TORCH_ARG(int64_t, fp8_amax_history) = 1024;
  // nullopt: the opt level's own (apex: static 1.0 at O0 and O3, dynamic at O1 and O2).
  TORCH_ARG(std::optional<LossScale>, loss_scale) = std::nullopt;
  // Global batch; each of W workers takes batch_size / W (integer division, as seed 000).
  TORCH_ARG(int64_t, batch_size) = 128;
  TORCH_ARG(int64_t, epochs) = 3;
  // Stop after this many optimizer iterations in total (0 = no limit).
  TORCH_ARG(int64_t, steps) = 0;
  // The optimization recipe. Unset (nullopt) is the model's, filled in by with_model_defaults(): the image
  // models train as the seeds do (SGD, StepLR, no clipping), a GPT as nanoGPT's train.py does (AdamW, the
  // cosine schedule, gradients clipped to norm 1.0). lr and weight decay follow the optimizer: SGD 0.05 and
  // 1e-4, AdamW nanoGPT's 6e-4 and 0.1.
  TORCH_ARG(std::optional<OptimizerKind>, optimizer) = std::nullopt;
  TORCH_ARG(std::optional<double>, lr) = std::nullopt;
  TORCH_ARG(double, momentum) = 0.9;  // SGD's
  TORCH_ARG(std::optional<double>, weight_decay) = std::nullopt;
  TORCH_ARG(std::optional<LrSchedule>, lr_schedule) = std::nullopt;
  // StepLR(step_size = lr_step epochs, gamma), with LibTorch's counting; 0 = constant lr.
  TORCH_ARG(int64_t, lr_step) = 0;
  TORCH_ARG(double, lr_gamma) = 0.1;
  // kCosine: optimizer steps from the end of the warmup to the floor of lr / 10 (0 = the run's last step).
  TORCH_ARG(int64_t, lr_decay_steps) = 0;
  // Linear warmup: the k-th optimizer step taken uses lr * k / warmup_steps until k reaches it. A step
  // skipped for inf/NaN gradients does not count (nor advance the schedule); 0 = off.
  TORCH_ARG(int64_t, warmup_steps) = 0;
  // Gradient accumulation: each optimizer step's batch (each worker's share of batch_size) runs as this many
  // equal micro-batches, forward and backward one at a time, each loss divided by their number (nanoGPT's
  // gradient_accumulation_steps, at the same global batch). Under a loss scaler all but the last backward
  // leave the gradients scaled (apex's delay_unscale); under DDP all but the last skip the allreduce
  // (no_sync). Less activation memory, the same step in exact arithmetic (not BatchNorm's statistics).
  TORCH_ARG(int64_t, grad_accum) = 1;
  // clip_grad_norm_ on the (unscaled) master gradients; 0 = off; unset = the model's (above).
  TORCH_ARG(std::optional<double>, clip_grad_norm) = std::nullopt;
  // BatchNorm statistics over the whole global batch (ampp::dist::SyncBatchNorm) instead of each
  // worker's share of it. The same as plain BatchNorm with one worker; the mlp has no BatchNorm.
  TORCH_ARG(bool, sync_batch_norm) = false;
  // With several workers: each keeps the SGD momentum of its shard of the parameters only
  // (ampp::dist::ZeroRedundancyOptimizer); checkpoints hold the whole state, as without it.
  TORCH_ARG(bool, zero) = false;
  // With several workers: fully sharded data parallel (ampp::dist::FullyShardedDataParallel) in place of DDP:
  // each worker keeps 1/N of the parameters, gradients and momentum, and gathers the model's units (a GPT's
  // blocks, a ResNet's stages) one at a time. O0 and O1; the same losses as DDP up to the reduction order.
  TORCH_ARG(bool, fsdp) = false;
  // With several workers: DDP's gradient allreduce and per-forward buffer broadcast through shared memory
  // among the workers of each machine, and Gloo only between one worker per machine
  // (ampp::dist::hierarchical_allreduce_hook, hierarchical_buffer_broadcast); false: Gloo for all.
  TORCH_ARG(bool, shared_memory_allreduce) = true;
  // MNIST-format images mapped from a file that the workers of this machine share (one copy of the pixels
  // per machine, not per worker; gzip files are decompressed once into ampp::user_cache_dir()/datasets);
  // false reads them into each worker's memory.
  TORCH_ARG(bool, map_data) = true;
  // Where the model and its batches live: "cpu", "cuda" (one GPU per local rank) or "cuda:N"; autocast and
  // the GradScaler follow the model there. CUDA has not been run in `ampp train` yet: docs/gpu.md.
  TORCH_ARG(std::string, device) = "cpu";
  // The GPU defaults, each ignored on the CPU (docs/gpu.md): cuDNN's benchmark mode (the fastest
  // convolution algorithms for the run's fixed shapes; never under `deterministic`), batches copied from
  // pinned host memory without blocking, and batches prefetched.
  TORCH_ARG(bool, cudnn_benchmark) = true;
  // ampp::FusedSGD / FusedAdamW (the same update in one kernel, skipped on the device; ZeRO's local one too).
  // nullopt: on a GPU only (uses_fused_optimizer()); true: on the CPU too; false: nowhere.
  TORCH_ARG(std::optional<bool>, fused_optimizer) = std::nullopt;
  TORCH_ARG(HostReads, host_reads) = HostReads::kAuto;
  TORCH_ARG(bool, pinned_batches) = true;
  // A loader thread prepares the next batch and copies it on a side stream while the current step runs
  // (ampp::train::BatchPrefetcher, as a DataLoader with one worker). The same batches, bit for bit.
  // nullopt: on a GPU only (uses_loader_thread(); on the CPU a batch is one gather and the thread would take
  // a core from the step); true: on the CPU too; false: nowhere.
  TORCH_ARG(std::optional<bool>, prefetch_batches) = std::nullopt;
  // On a GPU, one worker: each step is one CUDA graph replayed (ampp::CudaGraphStep) instead of hundreds of
  // launches, with GradScaler and ampp::FusedSGD, so that nothing in a step waits for the host; the loss,
  // accuracy, scale and skips are read every log_every steps. Refuses what needs the host every step.
  TORCH_ARG(bool, cuda_graphs) = false;
  // ModelOptions::channels_last: cnn and resnet activations in channels-last order (faster CPU kernels).
  TORCH_ARG(bool, channels_last) = true;
  // The number of classes; 0 = from the data (max label + 1; a class with no training image is an error).
  TORCH_ARG(int64_t, num_classes) = 0;
  // The run stops with an error after this many steps in a row were skipped for non-finite gradients
  // (at every opt level: without a loss scaler the gradients are checked before the step too), so a
  // diverged run never ends "successfully" or steps NaN into the weights. 0 = never stop.
  TORCH_ARG(int64_t, max_consecutive_skips) = 25;
  TORCH_ARG(uint64_t, seed) = 0;
  // Deterministic algorithms only (LibTorch's, erroring on a nondeterministic op), and on CUDA cuBLAS's
  // reproducible workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set); train() restores both when it ends.
  TORCH_ARG(bool, deterministic) = false;
  // Seconds a collective or the rendezvous waits for the other workers before failing (PyTorch's
  // default is 30 minutes; a stalled local worker is named sooner by the launcher's stall watch).
  TORCH_ARG(double, timeout) = 300;
  // Intra-op threads per worker; 0 = OMP_NUM_THREADS if set, else cores / local workers.
  TORCH_ARG(int, threads) = 0;
  // "" = no checkpoints. Written every epoch and every checkpoint_every steps (0 = per epoch only).
  TORCH_ARG(std::string, checkpoint_dir) = "";
  TORCH_ARG(int64_t, checkpoint_every) = 0;
  TORCH_ARG(bool, resume) = false;
  // "" = off. A PyTorch-format checkpoint to continue from (a file Python's torch.save wrote, or an
  // ampp checkpoint.pt): a training dict {"model", "optimizer", "scaler", "epoch", "batch", "step"}
  // continues at its position; a bare model state_dict starts this run from its weights. Used only
  // when the run has no checkpoint of its own to resume (a restarted worker continues from that).
  TORCH_ARG(std::string, resume_from) = "";
  // metrics.jsonl, summary.json, model.pt and the PNG plots go here.
  TORCH_ARG(std::string, out) = "ampp-train-out";
  // A step record every log_every steps (and for every skipped step).
  TORCH_ARG(int64_t, log_every) = 10;
  TORCH_ARG(bool, plots) = true;
  // The numerics doctor: rank 0 records every step's gradient exponents (a few passes over the
  // gradients per step) and writes doctor.json and doctor_gradients.png into `out` at the end, or when
  // the run diverges. See docs/numerics.md.
  TORCH_ARG(bool, doctor) = false;
  // "" = off. Rank 0 also writes metrics.jsonl's scalars (and, with the doctor, its gradient
  // histograms) as TensorBoard event files into this folder (include/ampp/train/tensorboard.h).
  TORCH_ARG(std::string, tensorboard) = "";
  // Progress output on rank 0 (false for quiet tests).
  TORCH_ARG(bool, progress) = true;
  // Print where each rank's step time went (data, forward, backward, allreduce wait, optimizer, ...) at
  // the end; summary.json holds it either way (include/ampp/train/step_phases.h). Also counts every
  // tensor (a wrapper around LibTorch's CPU allocator, from the start of train()) and reports rank 0's
  // memory by kind: weights, masters, gradients, optimizer state, data, activations (memory_report.h).
  TORCH_ARG(bool, profile) = false;
};

// The model's recipe, where the options leave it unset (TrainOptions::optimizer): one place for both sets of
// defaults. Every field of the result is set; train() and validate() start from it.
TrainOptions with_model_defaults(TrainOptions options);

// Throws c10::Error naming the bad option ("TrainOptions::lr must be ...") and the fix.
void validate(const TrainOptions& options);

// `text` as a device usable here: the CPU, or a CUDA GPU that this process sees. Throws c10::Error starting
// with `what` (the option's name, e.g. "TrainOptions::device") otherwise, naming the fix.
torch::Device usable_device(const std::string& text, const std::string& what);

// TrainOptions::device as a torch::Device (validate() has checked it).
torch::Device device_of(const TrainOptions& options);
// TrainOptions::fused_optimizer, host_reads and prefetch_batches, resolved for a run whose step runs on a GPU
// (`gpu_step`) or not.
bool uses_fused_optimizer(const TrainOptions& options, bool gpu_step);
bool reads_every_step(const TrainOptions& options, bool gpu_step);
bool uses_loader_thread(const TrainOptions& options, bool gpu_step);
// TrainOptions::data with the model's default filled in ("text" for a GPT).
std::string data_spec(const TrainOptions& options);
// A GPT's tokens per sequence: TrainOptions::context, or the preset's.
int64_t context_of(const TrainOptions& options);

// The checkpoint file inside checkpoint_dir.
std::string checkpoint_path(const TrainOptions& options);
// Its PyTorch-format twin for Python (checkpoint.pt, checkpoint.h), written with it.
std::string pytorch_checkpoint_path(const TrainOptions& options);

}  // namespace ampp::train
