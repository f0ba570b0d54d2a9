#pragma once
// Internal to ampp: this process among the workers, its device, and how DDP's workers reduce (Gloo, NCCL,
// shared memory).
#include "run.h"

namespace ampp::train::detail {

Workers set_up_workers(const TrainOptions& o);

// Runs `leader_work` on rank 0 only; every rank then learns whether it succeeded, so a failure
// there is an error on every rank instead of a hang in the next collective.
void on_leader_agreed(const Workers& w, const std::function<void()>& leader_work);

// Before any work: the output folders are usable, and no other run writes into `out`.
std::unique_ptr<FolderLock> claim_outputs(const TrainOptions& o, const Workers& w);

// This worker's device: TrainOptions::device, where "cuda" without an index means one GPU per local rank
// (torchrun's LOCAL_RANK), cuda:(local rank % GPUs), so that more workers than GPUs share them. It becomes
// the process's current CUDA device, which the collectives on CUDA tensors use.
torch::Device worker_device(const TrainOptions& o, const Workers& w);

// DDP over the workers; the workers of each machine reduce through shared memory, and only one per machine
// talks to the other machines.
void start_ddp(Run& run);

}  // namespace ampp::train::detail
