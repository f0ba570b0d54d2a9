// Internal to ampp (numerics): at::parallel_for's split of [0, n) over LibTorch's intra-op threads, whatever
// the compiler.
//
// Note [one OpenMP pool, any compiler]: LibTorch's OpenMP builds (the wheels, Debian's) run their intra-op
// threads on GNU's libgomp, and at::parallel_for is header-inline `#pragma omp parallel`. gcc lowers that
// pragma to GOMP_parallel, which the wheel's libgomp runs on LibTorch's own pool; clang lowers it to LLVM's
// __kmpc_fork_call, which libgomp does not have (a clang build could only run it on one thread, or load a
// second OpenMP runtime). parallel_chunks calls GOMP_parallel itself, as gcc's code would: the same pool and
// thread count as LibTorch's ops (at::set_num_threads), with gcc or clang, and no -fopenmp or separate
// precompiled header for the caller.
#pragma once

#include <cstdint>
#include <functional>

namespace ampp::numerics::detail {

// Calls f(begin, end) on disjoint ranges covering [0, n), at most one per intra-op thread and each of at
// least `grain` items (the last may be shorter), as at::parallel_for(0, n, grain, f) does. Serial inside a
// parallel region or with one thread. The first exception thrown by f is rethrown here.
void parallel_chunks(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f);

}  // namespace ampp::numerics::detail
