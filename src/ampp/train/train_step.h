#pragma once
// Internal to ampp: one training step, queued on the device with nothing read on the host, eager or captured
// as a CUDA graph (TrainOptions::cuda_graphs).
#include "run.h"

namespace ampp::train::detail {

// The step, eager or replayed from a CUDA graph (TrainOptions::cuda_graphs), added to the run's tally.
void run_step(Run& run, const Batch& batch);

// The graphed step: the eager step itself (train_step, added to the run's tally), captured. One worker
// only: DDP's collectives are not captured.
std::unique_ptr<detail::GraphedTrainStep> make_graphed_step(Run& run);

}  // namespace ampp::train::detail
