#pragma once
// Thread counts, decided in one place: how many cores this process may use (affinity-aware, so
// `taskset` and cgroup cpusets are respected, unlike std::thread::hardware_concurrency) and one
// thread count for every CPU compute pool a training step uses.

#include <string>

namespace ampp {

/// CPUs this process may run on (sched_getaffinity); at least 1.
int usable_cores();

/// max(1, usable_cores() / workers): intra-op threads per worker so that `workers` processes on
/// this machine fill its cores once.
int threads_per_worker(int workers);

/// Sets LibTorch's intra-op (OpenMP) threads and, when LibTorch's BLAS is OpenBLAS, OpenBLAS's own
/// pool to `threads` (MKL, the wheel's BLAS, runs on LibTorch's OpenMP threads: nothing more to
/// set). Why both: fp32 GEMMs run on OpenBLAS's pthread pool, which at::set_num_threads() does not
/// touch; its idle workers spin on sched_yield, so with more BLAS
/// threads than cores per process (2 workers on 2 cores) they take the core from the work itself
/// (measured: the default `ampp train` run 10% faster, results bit-identical).
void set_compute_threads(int threads);

/// The compute pools in force and their threads, e.g. "LibTorch: 2 OpenMP threads; BLAS: MKL (on
/// LibTorch's OpenMP threads)" (the wheel) or "...; BLAS: OpenBLAS 0.3.21 (own pool: 2 threads)"
/// (Debian's LibTorch), so a run says which BLAS it found.
std::string describe_compute_threads();

}  // namespace ampp
