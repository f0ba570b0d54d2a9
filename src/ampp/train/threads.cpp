#include <ampp/train/threads.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

namespace ampp::train {

void set_compute_threads(int threads) {
  TORCH_CHECK(threads >= 1, "set_compute_threads: need at least 1 thread, got ", threads);
  at::set_num_threads(threads);
  // Looked up at run time: LibTorch may be linked against another BLAS (or OpenBLAS may be absent).
  using SetThreads = void (*)(int);
  if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(threads);
}

}  // namespace ampp::train
