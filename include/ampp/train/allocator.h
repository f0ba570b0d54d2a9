#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Process-wide tuning of glibc's malloc for CPU training loops.

namespace ampp::train {

/// Makes glibc keep freed memory for reuse instead of returning it to the kernel: buffers up to
/// 32 MiB come from the heap (not one mmap each) and the heap is never trimmed. A training step
/// frees and re-allocates the same activation buffers every iteration; by default glibc unmaps
/// the large ones and trims the heap, so every step page-faults (and the kernel zeroes) them again.
/// Measured here: the reference CNN's fp32 step 2.0x faster at 1 thread (same-run ratio printed by
/// bench/train/ampp_bench_process_setup, LibTorch 1.13). Cost: the process keeps its peak heap size until exit.
/// Returns false (and changes nothing) where the C library is not glibc. Call it once, early.
bool retain_freed_memory();

/// The opposite, for runs whose point is a smaller footprint (FSDP): every buffer of 128 KiB or more gets a
/// mapping of its own, returned to the kernel when freed, so the process's size follows its live tensors.
/// glibc's default does that only until the first such free, after which it serves buffers up to that size
/// from a heap that fragments and does not shrink (measured by bench/dist/ampp_fsdp_bench: FSDP's peak RSS
/// stayed at DDP's without it). Cost: the page faults retain_freed_memory() avoids. Returns false where the
/// C library is not glibc.
bool return_freed_memory();

}  // namespace ampp::train
