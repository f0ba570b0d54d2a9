#pragma once
// Internal to ampp: the run's checkpoints, written atomically with the whole state (ZeRO's and FSDP's shards
// gathered).
#include "run.h"

namespace ampp::train::detail {

// Running sums become global totals held by rank 0, so any world size resumes them exactly.
void save(Run& run, int64_t epoch, int64_t batch);

// Whether the step just taken ends with a checkpoint before its epoch's end (which end_epoch() writes):
// every checkpoint_every steps, and where the step limit stops the run.
bool saves_mid_epoch(const Run& run, bool epoch_end, bool stop);

}  // namespace ampp::train::detail
