// ampp::dist::spawn: fn(local_rank, args...) in N forked children with the rendezvous environment;
// a failing child terminates the others and spawn throws naming the rank and the cause.
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ampp/dist/spawn.h>

#include "ampp/dist/launcher_posix.h"
#include "process_helpers.h"

namespace {

using ampp::dist::ProcessExitedException;
using ampp::dist::ProcessRaisedException;
using ampp::dist::SpawnOptions;
using ampp_test::TempDir;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Sets (or unsets) an environment variable for one test and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

void write_text(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path + ".tmp");
    out << text;
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "<unset>";
}

// Reads the pids the children wrote to dir/pid.<rank> (all that exist).
std::vector<pid_t> read_pids(const TempDir& dir, int n) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const std::string text = ampp_test::read_file(dir.file("pid." + std::to_string(i)));
    if (!text.empty()) pids.push_back(static_cast<pid_t>(std::stol(text)));
  }
  return pids;
}

void record_pid(const TempDir& dir, int rank) {
  write_text(dir.file("pid." + std::to_string(rank)), std::to_string(::getpid()));
}

// Survivors sleep (bounded) until spawn terminates them.
void sleep_until_terminated() { std::this_thread::sleep_for(std::chrono::seconds(30)); }

TEST(Spawn, RunsFnInEveryRankWithTheRendezvousEnvironment) {
  ScopedEnv no_port("MASTER_PORT", nullptr), no_addr("MASTER_ADDR", nullptr);
  TempDir dir;
  const pid_t parent = ::getpid();
  const std::string tag = "seed-args";
  ampp::dist::spawn(
      [&](int local_rank, int ngpus_per_node, const std::string& text) {
        std::string out;
        for (const char* name :
             {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
          out += std::string(name) + "=" + env(name) + "\n";
        }
        out += "ARG=" + std::to_string(ngpus_per_node) + "," + text + "\n";
        out += "PID=" + std::to_string(::getpid()) + "\n";
        out += "PPID=" + std::to_string(::getppid()) + "\n";
        write_text(dir.file("env." + std::to_string(local_rank)), out);
      },
      3, 3, tag);

  std::string port;
  std::set<std::string> pids;
  for (int i = 0; i < 3; ++i) {
    auto v = ampp_test::read_key_values(dir.file("env." + std::to_string(i)));
    ASSERT_FALSE(v.empty()) << "rank " << i << " did not run";
    EXPECT_EQ(v["RANK"], std::to_string(i));
    EXPECT_EQ(v["LOCAL_RANK"], std::to_string(i));
    EXPECT_EQ(v["WORLD_SIZE"], "3");
    EXPECT_EQ(v["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(v["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(v["ARG"], "3,seed-args");
    EXPECT_EQ(v["PPID"], std::to_string(parent));
    EXPECT_NE(v["PID"], std::to_string(parent));
    pids.insert(v["PID"]);
    const int p = std::stoi(v["MASTER_PORT"]);
    EXPECT_GT(p, 0);
    EXPECT_LE(p, 65535);
    if (i == 0) port = v["MASTER_PORT"];
    EXPECT_EQ(v["MASTER_PORT"], port) << "all ranks must rendezvous on the same port";
  }
  EXPECT_EQ(pids.size(), 3u) << "each rank runs in its own process";
  // The parent's environment is untouched.
  EXPECT_EQ(std::getenv("RANK"), nullptr);
}

TEST(Spawn, KeepsMasterAddressAndPortOfTheParent) {
  ScopedEnv port("MASTER_PORT", "23456"), addr("MASTER_ADDR", "10.1.2.3");
  TempDir dir;
  ampp::dist::spawn(
      [&](int rank) {
        write_text(dir.file("env." + std::to_string(rank)), env("MASTER_ADDR") + ":" + env("MASTER_PORT"));
      },
      2);
  EXPECT_EQ(ampp_test::read_file(dir.file("env.0")), "10.1.2.3:23456");
  EXPECT_EQ(ampp_test::read_file(dir.file("env.1")), "10.1.2.3:23456");
}

TEST(Spawn, ChildrenUseTheRequestedThreadCount) {
  TempDir dir;
  ampp::dist::spawn(
      SpawnOptions().num_threads(1),
      [&](int rank) {
        // A LibTorch computation in the child, with its own thread setting.
        auto x = torch::ones({1000, 100});
        const float sum = x.sum().item<float>();
        write_text(dir.file("t." + std::to_string(rank)), std::to_string(at::get_num_threads()) + " " +
                                                              env("OMP_NUM_THREADS") + " " +
                                                              std::to_string(static_cast<int>(sum)));
      },
      2);
  EXPECT_EQ(ampp_test::read_file(dir.file("t.0")), "1 1 100000");
  EXPECT_EQ(ampp_test::read_file(dir.file("t.1")), "1 1 100000");
}

TEST(Spawn, LimitsChildrenToOneThreadWhenTheParentAlreadyRunsThreads) {
  // Another thread in the parent (like a started OpenMP pool): a forked child must not use more
  // than one OpenMP thread, or it would hang in its first parallel region.
  // The helper is parked in its wait before spawn forks: forking while a thread is still starting
  // up (possibly inside the dynamic linker or libc, holding locks fork does not reset) can
  // deadlock the child, and that is not what this test is about.
  std::mutex m;
  std::condition_variable cv;
  bool parked = false, done = false;
  std::thread helper([&] {
    std::unique_lock<std::mutex> lock(m);
    parked = true;
    cv.notify_all();
    cv.wait(lock, [&] { return done; });
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return parked; });
  }
  TempDir dir;
  try {
    ampp::dist::spawn(
        SpawnOptions().num_threads(2),
        [&](int rank) {
          auto x = torch::randn({1 << 20});
          x = x.exp().sum();  // parallel region: would hang with a stale pool
          write_text(dir.file("t." + std::to_string(rank)), std::to_string(at::get_num_threads()));
        },
        2);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(m);
      done = true;
    }
    cv.notify_all();
    helper.join();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_all();
  helper.join();
  EXPECT_EQ(ampp_test::read_file(dir.file("t.0")), "1");
  EXPECT_EQ(ampp_test::read_file(dir.file("t.1")), "1");
}

TEST(Spawn, IdleOpenBlasThreadsDoNotLimitTheChildren) {
  // pthread OpenBLAS starts its server threads when it is loaded, so a program that has computed
  // nothing yet already runs more than one thread. They are not an OpenMP pool: OpenBLAS stops
  // them itself before a fork, so the children keep the requested thread count.
  const bool has_blas_threads =
      ::dlsym(RTLD_DEFAULT, "blas_thread_shutdown_") != nullptr && ampp::dist::detail::thread_count() >= 2;
  if (!has_blas_threads) {
    GTEST_SKIP() << "LibTorch here is not linked with pthread OpenBLAS (or it started no threads)";
  }
  TempDir dir;
  ampp::dist::spawn(
      SpawnOptions().num_threads(2),
      [&](int rank) {
        auto x = torch::randn({1 << 20});
        x = x.exp().sum();  // a parallel region with 2 threads in a fresh child
        write_text(dir.file("t." + std::to_string(rank)), std::to_string(at::get_num_threads()));
      },
      2);
  EXPECT_EQ(ampp_test::read_file(dir.file("t.0")), "2");
  EXPECT_EQ(ampp_test::read_file(dir.file("t.1")), "2");
}

TEST(Spawn, ExceptionInAChildNamesTheRankAndMessageAndStopsTheOthers) {
  TempDir dir;
  const auto start = Clock::now();
  try {
    ampp::dist::spawn(
        [&](int rank) {
          record_pid(dir, rank);
          if (rank == 1) {
            // Fail only once everybody is up, so the others really have to be terminated.
            ampp_test::wait_for_files({dir.file("pid.0"), dir.file("pid.2")}, std::chrono::seconds(10));
            throw std::runtime_error("boom in rank 1");
          }
          sleep_until_terminated();
        },
        3);
    FAIL() << "spawn must throw when a child throws";
  } catch (const ProcessRaisedException& e) {
    EXPECT_EQ(e.error_index(), 1);
    EXPECT_THAT(e.what(), HasSubstr("-- Process 1 terminated with the following error:"));
    EXPECT_THAT(e.what(), HasSubstr("std::runtime_error: boom in rank 1"));
    const auto pids = read_pids(dir, 3);
    ASSERT_EQ(pids.size(), 3u);
    EXPECT_EQ(e.pid(), pids[1]);
    for (pid_t pid : pids) EXPECT_FALSE(ampp_test::process_alive(pid)) << "pid " << pid << " left behind";
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
}

TEST(Spawn, TorchCheckFailureIsReportedWithoutTheCppBacktrace) {
  try {
    ampp::dist::spawn([](int rank) { TORCH_CHECK(rank != 0, "rank ", rank, " has a bad config"); }, 2);
    FAIL() << "spawn must throw";
  } catch (const ProcessRaisedException& e) {
    EXPECT_EQ(e.error_index(), 0);
    EXPECT_THAT(e.what(), HasSubstr("c10::Error: rank 0 has a bad config"));
    EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("frame #")));
  }
}

TEST(Spawn, NonZeroExitIsReportedWithTheExitCode) {
  TempDir dir;
  try {
    ampp::dist::spawn(
        [&](int rank) {
          record_pid(dir, rank);
          if (rank == 2) ::_exit(7);
          sleep_until_terminated();
        },
        3);
    FAIL() << "spawn must throw";
  } catch (const ProcessExitedException& e) {
    EXPECT_STREQ(e.what(), "process 2 terminated with exit code 7");
    EXPECT_EQ(e.error_index(), 2);
    EXPECT_EQ(e.exit_code(), 7);
    EXPECT_EQ(e.signal_name(), "");
    for (pid_t pid : read_pids(dir, 3)) EXPECT_FALSE(ampp_test::process_alive(pid));
  }
}

TEST(Spawn, DeathBySignalIsReportedWithTheSignalName) {
  TempDir dir;
  try {
    ampp::dist::spawn(
        [&](int rank) {
          record_pid(dir, rank);
          if (rank == 0) ::raise(SIGKILL);
          sleep_until_terminated();
        },
        2);
    FAIL() << "spawn must throw";
  } catch (const ProcessExitedException& e) {
    EXPECT_STREQ(e.what(), "process 0 terminated with signal SIGKILL");
    EXPECT_EQ(e.exit_code(), -SIGKILL);
    EXPECT_EQ(e.signal_name(), "SIGKILL");
    for (pid_t pid : read_pids(dir, 2)) EXPECT_FALSE(ampp_test::process_alive(pid));
  }
}

TEST(Spawn, ChildrenIgnoringSigtermAreKilledAfterTheGracePeriod) {
  TempDir dir;
  const auto start = Clock::now();
  EXPECT_THROW(ampp::dist::spawn(
                   SpawnOptions().grace_period(std::chrono::milliseconds(200)),
                   [&](int rank) {
                     ::signal(SIGTERM, SIG_IGN);
                     record_pid(dir, rank);
                     if (rank == 1) {
                       ampp_test::wait_for_files({dir.file("pid.0")}, std::chrono::seconds(10));
                       ::_exit(3);
                     }
                     sleep_until_terminated();
                   },
                   2),
               ProcessExitedException);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  for (pid_t pid : read_pids(dir, 2)) EXPECT_FALSE(ampp_test::process_alive(pid));
}

TEST(Spawn, DescendantsOfAFailedGroupAreKilledToo) {
  TempDir dir;
  EXPECT_THROW(ampp::dist::spawn(
                   [&](int rank) {
                     if (rank == 0) {
                       const pid_t grandchild = ::fork();
                       if (grandchild == 0) {
                         record_pid(dir, 0);
                         sleep_until_terminated();
                         ::_exit(0);
                       }
                       ampp_test::wait_for_files({dir.file("pid.0")}, std::chrono::seconds(10));
                       sleep_until_terminated();
                     } else {
                       ampp_test::wait_for_files({dir.file("pid.0")}, std::chrono::seconds(10));
                       ::_exit(4);
                     }
                   },
                   2),
               ProcessExitedException);
  const auto pids = read_pids(dir, 1);
  ASSERT_EQ(pids.size(), 1u);
  // The grandchild is not spawn's child (init reaps it), so give it a moment to disappear.
  EXPECT_TRUE(ampp_test::wait_until_dead(pids, std::chrono::seconds(5)));
}

TEST(Spawn, RejectsANonPositiveProcessCount) {
  try {
    ampp::dist::spawn([](int) {}, 0);
    FAIL() << "spawn must reject nprocs = 0";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("nprocs must be >= 1 (got 0)"));
  }
}

}  // namespace
