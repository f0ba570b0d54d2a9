// at::parallel_for's work split on LibTorch's OpenMP pool, by GNU's OpenMP ABI (Note [one OpenMP pool, any
// compiler] in parallel_chunks.h).

#include "parallel_chunks.h"

#include <ATen/Config.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>

#if AT_PARALLEL_OPENMP
// GNU's OpenMP ABI (libgomp; LLVM's and Intel's runtimes export the same entry points). GOMP_parallel runs
// fn(data) on a team of the default size (num_threads 0: omp_set_num_threads, which at::set_num_threads
// calls) and returns when every thread has.
extern "C" {
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
int omp_get_thread_num(void);
int omp_get_num_threads(void);
}
#endif

namespace ampp::numerics::detail {
namespace {

int64_t divup(int64_t a, int64_t b) { return (a + b - 1) / b; }

#if AT_PARALLEL_OPENMP
struct Team {
  int64_t n, grain;
  const std::function<void(int64_t, int64_t)>* f;
  std::once_flag failed;
  std::exception_ptr error;
};

// Each thread of the team takes one contiguous range, sized as at::internal::invoke_parallel sizes it.
void run_member(void* data) {
  auto& team = *static_cast<Team*>(data);
  int64_t threads = omp_get_num_threads();
  if (team.grain > 0) threads = std::min(threads, divup(team.n, team.grain));
  const int64_t tid = omp_get_thread_num();
  const int64_t chunk = divup(team.n, threads);
  const int64_t begin = tid * chunk;
  if (begin >= team.n) return;
  try {
    (*team.f)(begin, std::min(team.n, begin + chunk));
  } catch (...) {  // an exception must not unwind through libgomp's frames
    std::call_once(team.failed, [&] { team.error = std::current_exception(); });
  }
}
#endif

}  // namespace

void parallel_chunks(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  if (n <= 0) return;
  at::internal::lazy_init_num_threads();
#if AT_PARALLEL_OPENMP
  if (n > std::max<int64_t>(grain, 1) && at::get_num_threads() > 1 && !at::in_parallel_region()) {
    Team team{n, grain, &f, {}, nullptr};
    GOMP_parallel(run_member, &team, 0, 0);
    if (team.error) std::rethrow_exception(team.error);
    return;
  }
  f(0, n);
#else
  at::parallel_for(0, n, grain, f);  // a native thread pool: at::parallel_for is compiled into LibTorch
#endif
}

}  // namespace ampp::numerics::detail
