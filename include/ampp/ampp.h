#pragma once
// ampp: automatic mixed precision and data-parallel training for LibTorch.
// One include for the whole public API; each header also stands alone.
#include <ampp/autocast.h>     // ampp::autocast, op policies, fp16-on-CPU, hardware-aware bf16
#include <ampp/grad_scaler.h>  // ampp::GradScaler (PyTorch semantics + static/max/min/hysteresis)
#include <ampp/initialize.h>   // ampp::initialize, OptLevel O0-O3, Properties, FP32 master weights
#include <ampp/dist/dist.h>    // ampp::dist: process groups, DDP, DistributedSampler, spawn, launcher
