#pragma once
// Internal to ampp: the evaluation of the test split, after each epoch and when a finished run is resumed.
#include "run.h"

namespace ampp::train::detail {

// Test loss/accuracy: each rank takes a contiguous slice (no padding, so every image counts
// once), then sums are all-reduced.
Evaluation evaluate(Run& run);

// The rows evaluated at once: one training micro-batch of this rank (at least 1).
int64_t evaluation_batch(int64_t per_rank_batch, int64_t grad_accum);

}  // namespace ampp::train::detail
