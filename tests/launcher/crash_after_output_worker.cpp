// A worker for `ampp run` that prints without flushing (stdout into the launcher's pipe is fully
// buffered), joins the process group, and dies of an uncaught exception: its lines must still arrive.
// Rank 0 is the one that dies. The others flush their lines before the barrier, so all of them are in
// the pipe before rank 0 dies, and then wait until the launcher stops them. Without the barrier, a rank
// the launcher stopped before it reached its own end would lose its lines (it did under ASan).
#include <ampp/dist/process_group.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <thread>

int main() {
  auto pg = ampp::dist::init_process_group();
  std::printf("printf before the crash, rank %d\n", pg.rank());
  std::cout << "cout before the crash, rank " << pg.rank() << "\n";
  if (pg.rank() != 0) std::cout << std::flush, std::fflush(stdout);
  pg.barrier();
  if (pg.rank() != 0) std::this_thread::sleep_for(std::chrono::minutes(5));  // the launcher stops it first
  throw std::runtime_error("the worker's own error");
}
