#pragma once
// A training run in PyTorch's checkpoint format, both ways: what `ampp train` writes next to its own
// checkpoint (checkpoint.pt) for plain torch.load in Python, and what it continues from with
// --resume-from (a file torch.save wrote in Python). The format is pytorch_checkpoint.h's; this file
// maps a run (model, optimizer, loss scaler, position) onto it. See docs/training.md.
//
// The training dict: {"model": state_dict (float32), "optimizer": optimizer.state_dict(),
// "scaler": GradScaler.state_dict(), "epoch": the epoch to continue (= epochs completed),
// "batch": batches of that epoch done, "step": optimizer iterations so far}.
#include <ampp/train/checkpoint.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ampp::train {

/// Writes the training dict of `objects` at `position` (atomically). Under O2 "model" holds the FP32
/// masters' values. ampp resumes from its own checkpoint (which also holds the sampler and the RNG);
/// this file is for Python.
void save_pytorch_training_checkpoint(const std::string& path, const TrainingObjects& objects,
                                      const RunPosition& position);

/// What load_pytorch_training_checkpoint found and restored.
struct PyTorchCheckpointContents {
  bool weights_only = false;  ///< a bare model state_dict (as the seed 000 loop saves): nothing else restored
  bool optimizer = false;     ///< the optimizer's state and hyperparameters
  bool scaler = false;        ///< the loss scale and growth tracker
  int64_t epoch = 0, batch = 0, step = 0, skipped_steps = 0;
};

/// Restores `objects` from a PyTorch-format file: a training dict (every key but "model" optional) or
/// a bare model state_dict. The model loads strictly (missing/unexpected keys and shapes are one error
/// naming them all); under O2 the masters take the file's float32 values exactly. A scaler state is
/// loaded only when the run scales its loss. The sampler and RNG are not in the file: the sampler's
/// order follows from the run's seed and the epoch, as PyTorch's DistributedSampler's does.
PyTorchCheckpointContents load_pytorch_training_checkpoint(const std::string& path, const TrainingObjects& objects);

}  // namespace ampp::train
