#pragma once
// Internal to ampp: a run that diverged (skipped steps, non-finite weights or loss) stops with the reason
// and the fix.
#include "run.h"

namespace ampp::train::detail {

// The steps since the last read into the epoch's sums and the position, and the last step as the host
// sees it. A host synchronisation.
StepResult read_steps(Run& run, const detail::StepTally::Readout& r);

// The rules saw every step's skip flag in order at the read (skip_rules.h), so they name the first step
// that broke one, also where finite steps followed it before the read, and every rank stops at the same read.
void check_divergence(Run& run, const StepResult& step, const detail::StepTally::Readout& r);

// The weights (and O2's masters) must be finite before they are saved anywhere: a step taken on
// finite gradients can still overflow them (fp16 at O3, a huge learning rate). The checkpoint already
// on disk then keeps the last finite weights. false: not finite, in a diagnosis run.
bool check_finite_weights(Run& run);

bool check_final_loss(Run& run);

}  // namespace ampp::train::detail
