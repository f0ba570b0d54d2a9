#pragma once
// ampp's autocast kernels on LibTorch's AutocastCPU dispatch key.
//
// The first ampp::autocast region (or register_*_function call) replaces LibTorch's AutocastCPU
// kernels of the listed ops with ampp's policy-driven one. These functions make that explicit, e.g.
// to compare against LibTorch's stock autocast in a benchmark.

namespace ampp::precision {

/// Install ampp's kernels (idempotent; thread safe).
void install_autocast_kernels();
/// Remove them: LibTorch's own AutocastCPU kernels are back in force. Do not call while another
/// thread is inside an autocast region. The next ampp::autocast region installs them again.
void uninstall_autocast_kernels();
bool autocast_kernels_installed();

}  // namespace ampp::precision
