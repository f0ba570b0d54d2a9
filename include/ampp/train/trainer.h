#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// The training loop behind `ampp train`: one worker's share of a (possibly distributed)
// mixed-precision run with checkpoints, metrics and exact resume.
//
// Per step (the seeds' loop, through ampp::initialize so every opt level shares one path):
//   amp.zero_grad()   (the same gradients as opt.zero_grad(), see amp/amp.h)
//   loss = cross_entropy(amp.forward(ddp, x), y)   (autocast under O1, cast model under O2/O3)
//   amp.scale_loss(loss).backward()   (DDP allreduces during backward; the gradients are unscaled into
//                                      the FP32 masters; overflow -> the step is skipped, the scale backs off)
//   clip_grad_norm_(amp.master_params(), c)   (true gradients: after unscale, as seed 003)
//   amp.step()                        (steps FP32 masters under O2, copies back)
// and StepLR once per epoch (seed 000). Outputs: metrics.jsonl, summary.json, model.pt (FP32
// weights) and PNG plots in `out`; checkpoint.ampp in `checkpoint_dir`.
#include <ampp/train/metrics.h>
#include <ampp/train/options.h>

namespace ampp::train {

// Runs this process's part of the training. Before any work it checks that `out` and
// `checkpoint_dir` are writable and locks `out` against a second run. Resuming a run that already
// finished changes nothing and returns its stored summary (or rewrites outputs a crash cut off). Distributed when
// WORLD_SIZE > 1 in the environment (RANK, MASTER_ADDR, ... as set by `ampp run` / the launcher / torchrun). Returns
// the summary (identical on every rank for the globally reduced numbers).
Summary train(const TrainOptions& options);

}  // namespace ampp::train
