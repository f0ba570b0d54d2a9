#pragma once
// Internal to ampp: one training step, queued on the device with nothing read on the host, eager or captured
// as a CUDA graph (TrainOptions::cuda_graphs).
#include "run.h"

namespace ampp::train::detail {

// The step, eager or replayed from a CUDA graph (TrainOptions::cuda_graphs), added to the run's tally.
// The lr warm-up changes the lr every step, which a graph would have to capture anew each time: its steps
// run eagerly, and the graph is captured after it.
void run_step(Run& run, const Batch& batch, double lr);

// The graphed step: the eager step itself (train_step, added to the run's tally), captured. One worker
// only: DDP's collectives are not captured. On the CPU (the tests' uncaptured_graph_step) none: the
// eager step is the path a GPU captures, and the host reads as on a GPU (Run::reads_every_step).
std::unique_ptr<detail::GraphedTrainStep> make_graphed_step(Run& run);

}  // namespace ampp::train::detail
