// A worker for `ampp run` that prints without flushing (stdout into the launcher's pipe is fully
// buffered), joins the process group, and dies of an uncaught exception: its lines must still arrive.
#include <ampp/dist/process_group.h>

#include <cstdio>
#include <iostream>
#include <stdexcept>

int main() {
  auto pg = ampp::dist::init_process_group();
  std::printf("printf before the crash, rank %d\n", pg.rank());
  std::cout << "cout before the crash, rank " << pg.rank() << "\n";
  throw std::runtime_error("the worker's own error");
}
