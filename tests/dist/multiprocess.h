#pragma once
// Run a test body in several forked ranks (fork before any torch thread pool exists in the child's
// parent: the parent only forks and waits). Each child reports gtest failures through its exit
// code; a child that does not finish within the deadline is killed and reported.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <ampp/dist/process_group.h>

#include "ampp_test.h"

namespace ampp_test {
using namespace ampp::dist;

struct RankResult {
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
};

// Forks `world` children running body(rank); returns how each ended.
inline std::vector<RankResult> run_ranks(int world, const std::function<void(int rank)>& body,
                                         std::chrono::seconds deadline = std::chrono::seconds(30)) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      at::set_num_threads(1);
      int code = 0;
      try {
        body(rank);
        code = ::testing::Test::HasFailure() ? 1 : 0;
      } catch (const c10::Error& e) {
        std::fprintf(stderr, "[rank %d] uncaught c10::Error: %s\n", rank, e.what_without_backtrace());
        code = 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] uncaught exception: %s\n", rank, e.what());
        code = 2;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankResult> results(world);
  std::vector<bool> done(world, false);
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (int remaining = world; remaining > 0;) {
    for (int r = 0; r < world; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[r].signal = WTERMSIG(status);
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > end) {
      for (int r = 0; r < world; ++r)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          results[r].timed_out = true;
          done[r] = true;
        }
      break;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return results;
}

// Asserts that every rank exited 0.
inline void expect_all_ok(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung and was killed";
    EXPECT_EQ(results[r].signal, 0) << "rank " << r << " died from signal " << results[r].signal;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " failed (see its output above)";
  }
}

inline ProcessGroup init_tcp(int rank, int world, int port,
                             std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return init_process_group(InitOptions()
                                .init_method("tcp://127.0.0.1:" + std::to_string(port))
                                .rank(rank)
                                .world_size(world)
                                .timeout(timeout));
}

// The usual multi-rank test: `world` forked ranks, each joined to a TCP process group on a fresh
// port (`timeout` for its collectives), run body(rank, group); every rank must end cleanly.
inline void on_ranks(int world, const std::function<void(int rank, const ProcessGroup& group)>& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const int port = free_port();
  expect_all_ok(run_ranks(world, [&](int rank) { body(rank, init_tcp(rank, world, port, timeout)); }));
}

}  // namespace ampp_test
