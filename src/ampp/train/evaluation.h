#pragma once
// Internal to ampp: the evaluation of the test split, after each epoch and when a finished run is resumed.
#include "run.h"

namespace ampp::train::detail {

// Test loss/accuracy: each rank takes a contiguous slice (no padding, so every image counts
// once), then sums are all-reduced.
Evaluation evaluate(Run& run);

}  // namespace ampp::train::detail
