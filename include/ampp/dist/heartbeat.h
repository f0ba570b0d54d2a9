#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Progress heartbeats from a worker to its launcher (`ampp run`, `ampp train --nproc N`,
// ampp::dist::launch), so that a stalled worker is named within LaunchOptions::stall_timeout
// instead of the whole job waiting for a 30-minute collective timeout.
//
// The launcher gives each worker a file in AMPP_HEARTBEAT_FILE. report_progress(step) writes the
// step there (one pwrite: the file's mtime says the worker is alive, the number how far it got).
// Without the variable (no ampp launcher, e.g. torchrun) it does nothing. A worker is watched from
// its first report on, so start reporting when the work starts (after loading data).
#include <cstdint>

namespace ampp::dist {

/// Reports that this worker is alive and has reached `step` (any increasing count; call it at least
/// every few seconds while working, also in phases without steps such as evaluation).
void report_progress(int64_t step);

}  // namespace ampp::dist
