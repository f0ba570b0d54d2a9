#pragma once
// Internal to ampp: continuing a run from its checkpoint, or from a PyTorch-format file, and a finished run
// resumed.
#include "run.h"

namespace ampp::train::detail {

// Continues from the checkpoint when asked to (or restarted by the launcher) and one exists.
void resume(Run& run);

// Continues from a PyTorch-format file (TrainOptions::resume_from), unless the run resumed from its own
// checkpoint: a restarted worker continues from where this run got to, not from the file.
void resume_from_pytorch(Run& run);

bool nothing_left(const Run& run);

// Resuming a run that already finished changes nothing: its stored summary is the result. When
// its outputs are missing (a worker died between the last checkpoint and summary.json), they are
// rebuilt from the checkpoint: the same model, a deterministic evaluation, the stored train loss.
Summary finish_finished_run(Run& run);

}  // namespace ampp::train::detail
