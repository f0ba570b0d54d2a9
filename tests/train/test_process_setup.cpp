// Process-wide setup `ampp train` runs: glibc keeps freed buffers, BLAS and LibTorch share a thread count.
#include <ampp/train/allocator.h>
#include <ampp/util/threads.h>
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__GLIBC__)
TEST(RetainFreedMemory, BuffersUpTo32MiBComeFromTheHeapAndStayThere) {
#if defined(__SANITIZE_ADDRESS__)
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
#endif

TEST(SetComputeThreads, SetsLibTorchThreadsAndRejectsZero) {
  const int before = at::get_num_threads();
  ampp::set_compute_threads(1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_THROW(ampp::set_compute_threads(0), c10::Error);
  ampp::set_compute_threads(before);
}
