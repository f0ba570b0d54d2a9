#pragma once
// ampp::dist: process groups, DistributedDataParallel, FullyShardedDataParallel, SyncBatchNorm,
// ZeroRedundancyOptimizer, comm hooks, DistributedSampler, spawn and the launcher behind `ampp run`.
#include <ampp/dist/comm_hooks.h>
#include <ampp/dist/ddp.h>
#include <ampp/dist/fully_shard.h>
#include <ampp/dist/join.h>
#include <ampp/dist/launcher.h>
#include <ampp/dist/log.h>
#include <ampp/dist/process_group.h>
#include <ampp/dist/sampler.h>
#include <ampp/dist/spawn.h>
#include <ampp/dist/sync_batch_norm.h>
#include <ampp/dist/zero_redundancy_optimizer.h>
