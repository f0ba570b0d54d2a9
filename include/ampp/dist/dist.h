#pragma once
// ampp::dist: process groups, DistributedDataParallel, comm hooks, DistributedSampler, spawn.
#include <ampp/dist/process_group.h>
#include <ampp/dist/log.h>
#if __has_include(<ampp/dist/ddp.h>)
#include <ampp/dist/ddp.h>
#endif
#if __has_include(<ampp/dist/comm_hooks.h>)
#include <ampp/dist/comm_hooks.h>
#endif
#if __has_include(<ampp/dist/sampler.h>)
#include <ampp/dist/sampler.h>
#endif
#if __has_include(<ampp/dist/spawn.h>)
#include <ampp/dist/spawn.h>
#endif
