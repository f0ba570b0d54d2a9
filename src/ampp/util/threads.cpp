#include <ampp/util/threads.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <thread>

namespace ampp {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());  // affinity unknown: all of them
}

int threads_per_worker(int workers) { return std::max(1, usable_cores() / std::max(1, workers)); }

void set_compute_threads(int threads) {
  TORCH_CHECK(threads >= 1, "set_compute_threads: need at least 1 thread, got ", threads);
  at::set_num_threads(threads);
  // Looked up at run time: LibTorch may be linked against another BLAS (or OpenBLAS may be absent).
  using SetThreads = void (*)(int);
  if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(threads);
}

std::string describe_compute_threads() {
  using GetThreads = int (*)();
  using GetConfig = char* (*)();
  std::string blas;
  if (at::hasMKL()) {
    blas = "MKL (on LibTorch's OpenMP threads)";
  } else if (auto* get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) {
    auto* config = reinterpret_cast<GetConfig>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
    blas = fmt::format("{} (own pool: {} threads)", config ? config() : "OpenBLAS", get());
  } else {
    blas = "neither MKL nor OpenBLAS (no pool of its own sized)";
  }
  return fmt::format("LibTorch: {} threads; BLAS: {}", at::get_num_threads(), blas);
}

}  // namespace ampp
