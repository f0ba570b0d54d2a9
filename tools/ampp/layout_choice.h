#pragma once
// `ampp train --nproc auto` (the default): the number of worker processes this job trains fastest
// with on this machine. Processes x threads is a machine question (cores, caches, the BLAS and oneDNN
// kernels at each batch size, the cost of the collectives), so it is measured, not assumed: a short run
// of the same job per candidate, once per machine and job, the result cached. Several processes keep
// DDP's semantics (each worker a share of the global batch); one process trains the whole batch.
#include <ampp/train/trainer.h>

#include <string>

namespace ampp::cli {

struct LayoutChoice {
  int nproc = 1;
  std::string reason;  // one line for the user: what was chosen, from what
};

// When resuming a checkpoint: the worker count it was written with (a run keeps its layout). Otherwise
// the candidate (1 .. cores workers, dividing the cores) with the most images/s in a short run of this
// job started from `self_exe`, looked up in or added to `cache_file`. A failed measurement falls back to
// one process and says so (the run itself then reports what is wrong). Prints that it measures unless
// TrainOptions::progress is off (--quiet).
LayoutChoice choose_layout(const train::TrainOptions& o, const std::string& self_exe, const std::string& cache_file);

// $XDG_CACHE_HOME/ampp/layouts.json, else $HOME/.cache/ampp/layouts.json.
std::string default_layout_cache();

}  // namespace ampp::cli
