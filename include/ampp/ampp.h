#pragma once
// ampp: automatic mixed precision and data-parallel training for LibTorch.
// One include for the whole public API, layer by layer (docs/architecture.md); each header also
// stands alone. The headers under include/ampp that this one does not reach are internal, and say so.
// The API is LibTorch's types and ampp's own: no fmt, nlohmann-json or protobuf type appears in it.

// util: number parsing, core and thread counts, the LibTorch version macro, ampp's version
#include <ampp/util/batch_norm_like.h>
#include <ampp/util/launch_environment.h>
#include <ampp/util/parse_number.h>
#include <ampp/util/state_dict.h>
#include <ampp/util/threads.h>
#include <ampp/util/torch_version.h>
#include <ampp/util/version.h>

// numerics: fused unscale + non-finite check, the loss-scale update rule
#include <ampp/numerics/unscale.h>
#include <ampp/numerics/update_scale.h>

// precision: ampp::autocast, op policies, fp16 on CPU, hardware-aware bf16, fp8 Linear products
#include <ampp/precision/autocast.h>
#include <ampp/precision/cpu_features.h>
#include <ampp/precision/dtype.h>
#include <ampp/precision/float8.h>
#include <ampp/precision/float8_delayed.h>
#include <ampp/precision/float8_linear.h>
#include <ampp/precision/float8_ranges.h>
#include <ampp/precision/kernels.h>
#include <ampp/precision/nonfinite_locator.h>
#include <ampp/precision/op_policy.h>
#include <ampp/precision/rounding.h>

// scaling: ampp::GradScaler (PyTorch semantics + static/max/min/hysteresis), FusedSGD, FusedAdamW,
// CudaGraphStep (a whole training step captured as a CUDA graph)
#include <ampp/scaling/cuda_graph_step.h>
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/scaling/grad_scaler.h>
#include <ampp/scaling/gradient_ranges.h>
#include <ampp/scaling/skip_ledger.h>

// io: files in PyTorch's torch.save format, state dicts in PyTorch's layouts, torch::serialize archives
// read from untrusted bytes
#include <ampp/io/archive_reader.h>
#include <ampp/io/pytorch_checkpoint.h>

// amp: ampp::initialize, OptLevel O0-O3, Properties, the Amp handle, FP32 master weights
#include <ampp/amp/amp.h>
#include <ampp/amp/initialize.h>
#include <ampp/amp/opt_level.h>
#include <ampp/amp/properties.h>

// dist: process groups, DDP, comm hooks, DistributedSampler, spawn, the launcher
#include <ampp/dist/dist.h>
#include <ampp/dist/grad_bucket.h>
#include <ampp/dist/reducer.h>

// train: the pieces of `ampp train` a loop of one's own can use (data, batches, models, checkpoints in
// ampp's and PyTorch's formats, TensorBoard). The CLI's own machinery (its options, loop, metrics and
// malloc tuning) is internal and not installed.
#include <ampp/train/batches.h>
#include <ampp/train/checkpoint.h>
#include <ampp/train/dataset.h>
#include <ampp/train/gpt.h>
#include <ampp/train/models.h>
#include <ampp/train/named_master_params.h>
#include <ampp/train/prefetcher.h>
#include <ampp/train/pytorch_training_checkpoint.h>
#include <ampp/train/save.h>
#include <ampp/train/tensorboard.h>
