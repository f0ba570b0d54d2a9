// Process-wide setup `ampp train` runs: glibc keeps freed buffers (or, for --fsdp, returns them), BLAS and LibTorch
// share a thread count.
#include <ampp/train/allocator.h>
#include <ampp/util/threads.h>
#include <gtest/gtest.h>

#include "ampp_test.h"

#include <ATen/Parallel.h>

#include <dlfcn.h>
#include <fmt/format.h>
#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__GLIBC__)
TEST(RetainFreedMemory, BuffersUpTo32MiBComeFromTheHeapAndStayThere) {
#if defined(AMPP_TEST_UNDER_ASAN)
  GTEST_SKIP() << "AddressSanitizer replaces malloc: glibc's mallopt/mallinfo2 do not apply";
#endif
  ASSERT_TRUE(ampp::train::retain_freed_memory());
  const size_t bytes = 16u << 20;  // by default glibc mmaps (and later unmaps) a block this size
  const size_t mapped_before = mallinfo2().hblkhd;
  char* block = static_cast<char*>(std::malloc(bytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, bytes);
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before) << "a 16 MiB block was given its own mapping";
  const size_t heap_with_block = mallinfo2().arena;
  EXPECT_GE(heap_with_block, bytes);
  std::free(block);
  EXPECT_EQ(mallinfo2().arena, heap_with_block) << "the heap was trimmed after the free";
}

// The opposite setting (--fsdp's): a block of 128 KiB or more has a mapping of its own, gone when freed,
// even after a free that would have raised glibc's sliding threshold.
TEST(ReturnFreedMemory, BuffersFrom128KiBGetTheirOwnMappingAndGiveItBack) {
#if defined(AMPP_TEST_UNDER_ASAN)
  GTEST_SKIP() << "AddressSanitizer replaces malloc: glibc's mallopt/mallinfo2 do not apply";
#endif
  ASSERT_TRUE(ampp::train::return_freed_memory());
  for (const size_t bytes : {size_t{256} << 10, size_t{4} << 20, size_t{256} << 10}) {
    const size_t mapped_before = mallinfo2().hblkhd;
    char* block = static_cast<char*>(std::malloc(bytes));
    ASSERT_NE(block, nullptr);
    std::memset(block, 1, bytes);
    EXPECT_GE(mallinfo2().hblkhd, mapped_before + bytes) << bytes << " bytes came from the heap";
    std::free(block);
    EXPECT_EQ(mallinfo2().hblkhd, mapped_before) << bytes << " bytes stayed mapped after the free";
  }
}
#endif

// The BLAS pool's own thread count, when LibTorch's BLAS has one: OpenBLAS (Debian's LibTorch)
// or MKL (the wheel). -1 when neither is loaded.
int blas_threads() {
  using GetThreads = int (*)();
  if (auto* openblas = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) return openblas();
  if (auto* mkl = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "mkl_get_max_threads"))) return mkl();
  return -1;
}

TEST(SetComputeThreads, SetsLibTorchAndBlasThreadsAndRejectsZero) {
  const int before = at::get_num_threads();
  for (int threads : {1, 2}) {
    ampp::set_compute_threads(threads);
    EXPECT_EQ(at::get_num_threads(), threads);
    const int blas = blas_threads();
    if (blas != -1) EXPECT_EQ(blas, threads) << "the BLAS pool kept its own size";
    EXPECT_NE(ampp::describe_compute_threads().find(fmt::format("LibTorch: {} threads", threads)), std::string::npos);
  }
  EXPECT_THROW(ampp::set_compute_threads(0), c10::Error);
  ampp::set_compute_threads(before);
}

TEST(UsableCores, FollowsTheAffinityMaskNotTheMachine) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(ampp::usable_cores(), CPU_COUNT(&saved));
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &saved)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // as under `taskset -c N`
  EXPECT_EQ(ampp::usable_cores(), 1);
  EXPECT_EQ(ampp::threads_per_worker(2), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
}
