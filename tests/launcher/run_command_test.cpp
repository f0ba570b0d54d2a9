// `ampp run` driven as a real program: environment per rank, rank-prefixed output, teardown when a
// worker dies, restarts, signal forwarding, errors for bad flags. Every run has a hard timeout.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "process_helpers.h"

namespace {

using ampp_test::RunResult;
using ampp_test::TempDir;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

const std::string kAmpp = AMPP_CLI_PATH;
const std::string kWorker = AMPP_TEST_WORKER_PATH;
constexpr std::chrono::seconds kTimeout{20};

// The test environment without thread settings (so the launcher's defaults show).
std::vector<std::string> clean_env(std::map<std::string, std::optional<std::string>> more = {}) {
  more.emplace("OMP_NUM_THREADS", std::nullopt);
  more.emplace("OPENBLAS_NUM_THREADS", std::nullopt);
  more.emplace("NCCL_ASYNC_ERROR_HANDLING", std::nullopt);
  return ampp_test::environment_with(more);
}

RunResult ampp_run(std::vector<std::string> args, const std::vector<std::string>& env = clean_env(),
                   const std::function<void(pid_t)>& during = {}) {
  args.insert(args.begin(), {kAmpp, "run"});
  return ampp_test::run_command(args, env, kTimeout, during);
}

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code()) + (r.timed_out ? " (TIMED OUT)" : "") + "\n--- stdout\n" + r.out +
         "--- stderr\n" + r.err;
}

std::vector<pid_t> pids_of(const TempDir& dir, int n) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const std::string text = ampp_test::read_file(dir.file("pid." + std::to_string(i)));
    if (!text.empty()) pids.push_back(static_cast<pid_t>(std::stol(text)));
  }
  return pids;
}

std::vector<std::string> pid_files(const TempDir& dir, int n) {
  std::vector<std::string> files;
  for (int i = 0; i < n; ++i) files.push_back(dir.file("pid." + std::to_string(i)));
  return files;
}

TEST(AmppRun, SetsTorchrunsEnvironmentForEveryRank) {
  TempDir dir;
  const RunResult r = ampp_run({"--nproc-per-node", "2", "--master-port", "29555", "--rdzv-id", "job7", "--", kWorker,
                                "env", dir.str(), "--lr", "0.1"},
                               clean_env({{"AMPP_TEST_INHERITED", "yes"}}));
  ASSERT_EQ(r.exit_code(), 0) << describe(r);
  const std::string threads = std::to_string(ampp_test::expected_threads(2));
  for (int rank = 0; rank < 2; ++rank) {
    auto v = ampp_test::read_key_values(dir.file("env." + std::to_string(rank)));
    ASSERT_FALSE(v.empty()) << "rank " << rank << " did not run\n" << describe(r);
    const std::string R = std::to_string(rank);
    EXPECT_EQ(v["RANK"], R);
    EXPECT_EQ(v["LOCAL_RANK"], R);
    EXPECT_EQ(v["ROLE_RANK"], R);
    EXPECT_EQ(v["WORLD_SIZE"], "2");
    EXPECT_EQ(v["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(v["ROLE_WORLD_SIZE"], "2");
    EXPECT_EQ(v["GROUP_RANK"], "0");
    EXPECT_EQ(v["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(v["ROLE_NAME"], "default");
    EXPECT_EQ(v["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(v["MASTER_PORT"], "29555");
    EXPECT_EQ(v["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(v["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(v["TORCHELASTIC_RUN_ID"], "job7");
    EXPECT_EQ(v["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(v["NCCL_ASYNC_ERROR_HANDLING"], "1");
    EXPECT_EQ(v["OMP_NUM_THREADS"], threads);
    EXPECT_EQ(v["OPENBLAS_NUM_THREADS"], threads);
    EXPECT_EQ(v["AMPP_TEST_INHERITED"], "yes");
    EXPECT_EQ(v["ARGV"], dir.str() + " --lr 0.1") << "arguments after the program are its own";
  }
  EXPECT_THAT(r.err, HasSubstr("OMP_NUM_THREADS=" + threads + " and OPENBLAS_NUM_THREADS=" + threads));
}

TEST(AmppRun, ComputesGlobalRanksFromNodeRankAndAcceptsUnderscoreSpellings) {
  TempDir dir;
  const RunResult r = ampp_run({"--nnodes=2", "--node_rank=1", "--nproc_per_node=2", "--master_addr=10.9.8.7",
                                "--master_port=29600", kWorker, "env", dir.str()});
  ASSERT_EQ(r.exit_code(), 0) << describe(r);
  for (int local = 0; local < 2; ++local) {
    const int rank = 2 + local;
    auto v = ampp_test::read_key_values(dir.file("env." + std::to_string(rank)));
    ASSERT_FALSE(v.empty()) << describe(r);
    EXPECT_EQ(v["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(v["WORLD_SIZE"], "4");
    EXPECT_EQ(v["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(v["GROUP_RANK"], "1");
    EXPECT_EQ(v["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(v["MASTER_ADDR"], "10.9.8.7");
    EXPECT_EQ(v["MASTER_PORT"], "29600");
  }
}

TEST(AmppRun, KeepsThreadSettingsTheUserGave) {
  TempDir dir;
  const RunResult r = ampp_run({"--nproc-per-node", "2", "--", kWorker, "env", dir.str()},
                               clean_env({{"OMP_NUM_THREADS", "3"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}}));
  ASSERT_EQ(r.exit_code(), 0) << describe(r);
  auto v = ampp_test::read_key_values(dir.file("env.1"));
  EXPECT_EQ(v["OMP_NUM_THREADS"], "3");
  EXPECT_EQ(v["OPENBLAS_NUM_THREADS"], std::to_string(ampp_test::expected_threads(2)));
  EXPECT_EQ(v["NCCL_ASYNC_ERROR_HANDLING"], "0");
  // Without --master-port on one node a free port is chosen.
  const int port = std::stoi(v["MASTER_PORT"]);
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  EXPECT_EQ(ampp_test::read_key_values(dir.file("env.0"))["MASTER_PORT"], v["MASTER_PORT"]);
}

TEST(AmppRun, PrefixesEveryWorkerLineWithItsRank) {
  TempDir dir;
  const RunResult r = ampp_run({"--nproc-per-node", "2", "--", kWorker, "env", dir.str()});
  ASSERT_EQ(r.exit_code(), 0) << describe(r);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[rank" + std::to_string(rank) + "]: ";
    const std::string R = std::to_string(rank);
    EXPECT_THAT(r.out, HasSubstr(p + "hello stdout rank " + R + "\n" + p + "second line rank " + R + "\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "tail " + R + "\n")) << "an unterminated last line is printed";
    EXPECT_THAT(r.err, HasSubstr(p + "hello stderr rank " + R + "\n"));
  }
  std::istringstream lines(r.out);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    EXPECT_THAT(line, ::testing::MatchesRegex("\\[rank[01]\\]: .*")) << "stdout carries only worker lines";
    ++count;
  }
  EXPECT_EQ(count, 6);
}

// A worker that dies of an uncaught exception keeps what it printed (ampp's process group flushes stdout
// before the terminate handler aborts), and the exception shows too.
TEST(AmppRun, AWorkerThatCrashesKeepsItsOutput) {
  const RunResult r = ampp_run({"--nproc-per-node", "2", "--", AMPP_TEST_CRASH_WORKER_PATH});
  EXPECT_NE(r.exit_code(), 0) << describe(r);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[rank" + std::to_string(rank) + "]: ", R = std::to_string(rank);
    EXPECT_THAT(r.out, HasSubstr(p + "printf before the crash, rank " + R + "\n")) << describe(r);
    EXPECT_THAT(r.out, HasSubstr(p + "cout before the crash, rank " + R + "\n")) << describe(r);
  }
  EXPECT_THAT(r.err, HasSubstr("the worker's own error")) << describe(r);
}

TEST(AmppRun, WorkerKilledWithSigkillTearsDownTheGroupQuickly) {
  TempDir dir;
  Clock::time_point killed_at;
  const RunResult r = ampp_run({"--nproc-per-node", "3", "--", kWorker, "sleep", dir.str()}, clean_env(), [&](pid_t) {
    ASSERT_TRUE(ampp_test::wait_for_files(pid_files(dir, 3), std::chrono::seconds(10)));
    const auto pids = pids_of(dir, 3);
    killed_at = Clock::now();
    ::kill(pids[1], SIGKILL);
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
  ASSERT_FALSE(r.timed_out) << describe(r);
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(r.exit_code(), 1) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("worker rank 1 (local rank 1, pid " + std::to_string(pids_of(dir, 3)[1]) +
                               ") failed with signal SIGKILL"));
  for (pid_t pid : pids_of(dir, 3)) EXPECT_FALSE(ampp_test::process_alive(pid)) << "pid " << pid << " left behind";
}

TEST(AmppRun, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  TempDir dir;
  const RunResult r =
      ampp_run({"--nproc-per-node", "2", "--shutdown-grace", "0.3", "--", kWorker, "ignore-term", dir.str(), "1"});
  ASSERT_FALSE(r.timed_out) << describe(r);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_THAT(r.err, HasSubstr("worker rank 1 (local rank 1"));
  EXPECT_THAT(r.err, HasSubstr("failed with exit code 5"));
  EXPECT_THAT(r.err, HasSubstr("sending SIGKILL"));
  for (pid_t pid : pids_of(dir, 2)) EXPECT_FALSE(ampp_test::process_alive(pid));
}

TEST(AmppRun, MaxRestartsRestartsTheWholeGroupWithTheRestartCount) {
  TempDir dir;
  const RunResult r =
      ampp_run({"--nproc-per-node", "2", "--max-restarts", "1", "--", kWorker, "fail-first", dir.str()});
  ASSERT_EQ(r.exit_code(), 0) << describe(r);
  for (const char* f : {"attempt.0.0", "attempt.1.0", "attempt.0.1", "attempt.1.1"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.file(f))) << f << "\n" << describe(r);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("attempt.0.2")));
  EXPECT_THAT(r.err, HasSubstr("[rank1]: rank 1 fails on its first attempt"));
  EXPECT_THAT(r.err, HasSubstr("failed with exit code 3; 1/1 restarts left, restarting"));
}

TEST(AmppRun, FailsAfterTheRestartsAreUsedUp) {
  const RunResult r = ampp_run({"--nproc-per-node", "2", "--max-restarts", "1", "--", kWorker, "exit-rank", "1", "3"});
  ASSERT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_THAT(r.err, HasSubstr("restart 1/1"));
  EXPECT_THAT(r.err, HasSubstr("error: worker rank 1 (local rank 1"));
  EXPECT_THAT(r.err, HasSubstr("failed with exit code 3 (after 1 restarts)"));
}

TEST(AmppRun, ForwardsSigtermToTheWorkers) {
  TempDir dir;
  const RunResult r =
      ampp_run({"--nproc-per-node", "2", "--", kWorker, "trap-signal", dir.str()}, clean_env(), [&](pid_t ampp) {
        ASSERT_TRUE(ampp_test::wait_for_files(pid_files(dir, 2), std::chrono::seconds(10)));
        ::kill(ampp, SIGTERM);
      });
  ASSERT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code(), 128 + SIGTERM) << describe(r);
  EXPECT_EQ(ampp_test::read_file(dir.file("signal.0")), "SIGTERM");
  EXPECT_EQ(ampp_test::read_file(dir.file("signal.1")), "SIGTERM");
  EXPECT_THAT(r.err, HasSubstr("stopped by SIGTERM"));
  for (pid_t pid : pids_of(dir, 2)) EXPECT_FALSE(ampp_test::process_alive(pid));
}

TEST(AmppRun, RunsAProgramGivenWithoutTheSeparator) {
  TempDir dir;
  const RunResult r = ampp_run({"--nproc-per-node", "1", kWorker, "env", dir.str(), "--nnodes", "5"});
  ASSERT_EQ(r.exit_code(), 0) << describe(r);
  auto v = ampp_test::read_key_values(dir.file("env.0"));
  EXPECT_EQ(v["WORLD_SIZE"], "1");
  EXPECT_EQ(v["ARGV"], dir.str() + " --nnodes 5") << "options after the program belong to it";
}

struct BadFlags {
  std::vector<std::string> args;
  std::string message;
};

TEST(AmppRun, BadFlagsFailWithAClearMessage) {
  const std::vector<BadFlags> cases = {
      {{"--nproc-per-node", "0", "--", "true"}, "--nproc-per-node must be >= 1 (got 0)"},
      {{"--nproc-per-node", "two", "--", "true"}, "--nproc-per-node expects an integer, got 'two'"},
      {{"--nnodes", "2", "--node-rank", "2", "--", "true"}, "--node-rank 2 is out of range for --nnodes 2"},
      {{"--nnodes", "1:4", "--", "true"}, "elastic node ranges"},
      {{"--master-port", "70000", "--", "true"}, "--master-port 70000 is out of range"},
      {{"--nproc-per-node", "2", "--"}, "no program given"},
      {{"--", "/nonexistent/trainer"}, "cannot execute '/nonexistent/trainer'"},
      {{"--", "ampp-no-such-program"}, "program 'ampp-no-such-program' not found in PATH"},
      {{"--nproc-per-node", "gpu", "--", "true"}, "CUDA is not available"},
  };
  // All at once: each case costs one start of the ampp binary (LibTorch loading), not one each.
  std::vector<std::vector<std::string>> argvs;
  for (const auto& c : cases) {
    argvs.push_back(c.args);
    argvs.back().insert(argvs.back().begin(), {kAmpp, "run"});
  }
  const auto results = ampp_test::run_commands(argvs, clean_env(), kTimeout);
  for (size_t i = 0; i < cases.size(); ++i) {
    const RunResult& r = results[i];
    SCOPED_TRACE(cases[i].message);
    ASSERT_FALSE(r.timed_out) << describe(r);
    EXPECT_EQ(r.exit_code(), 2) << describe(r);
    EXPECT_THAT(r.err, HasSubstr(cases[i].message)) << describe(r);
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("frame #"))) << "no C++ backtrace for user errors";
    EXPECT_TRUE(r.out.empty()) << "nothing was started";
  }
}

}  // namespace
