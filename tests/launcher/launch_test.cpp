// ampp::dist::launch as a library call (what `ampp train --nproc N` uses).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>

#include <gtest/gtest.h>
#include "ampp_test.h"

#include <c10/util/Exception.h>

#include <ampp/dist/launcher.h>

#include "ampp/dist/launcher_posix.h"

namespace {

using ::testing::HasSubstr;

std::string validation_error(const ampp::dist::LaunchOptions& options) {
  return ampp_test::error_of([&] { ampp::dist::validate(options); });
}

TEST(Launch, ValidateNamesTheBadOptionAndTheFix) {
  using ampp::dist::LaunchOptions;
  EXPECT_EQ(validation_error(LaunchOptions()), "<no error>");
  EXPECT_THAT(validation_error(LaunchOptions().nproc_per_node(0)),
              HasSubstr("LaunchOptions::nproc_per_node must be >= 1 (got 0)"));
  EXPECT_THAT(validation_error(LaunchOptions().nnodes(3).node_rank(3)),
              HasSubstr("give each node a distinct rank in 0..2"));
  EXPECT_THAT(validation_error(LaunchOptions().node_rank(-1)),
              HasSubstr("LaunchOptions::node_rank -1 is out of range"));
  EXPECT_THAT(validation_error(LaunchOptions().master_port(65536)), HasSubstr("use a TCP port in 1..65535"));
  EXPECT_THAT(validation_error(LaunchOptions().master_port(-1)),
              HasSubstr("LaunchOptions::master_port -1 is out of range"));
  EXPECT_THAT(validation_error(LaunchOptions().nnodes(0)), HasSubstr("LaunchOptions::nnodes must be >= 1 (got 0)"));
  EXPECT_THAT(validation_error(LaunchOptions().max_restarts(-2)),
              HasSubstr("LaunchOptions::max_restarts must be >= 0 (got -2)"));
  EXPECT_THAT(validation_error(LaunchOptions().master_addr("")), HasSubstr("LaunchOptions::master_addr is empty"));
  EXPECT_THAT(validation_error(LaunchOptions().shutdown_grace(std::chrono::milliseconds(-1))),
              HasSubstr("grace period must be >= 0"));
}

TEST(Launch, ReturnsZeroWhenEveryWorkerSucceedsAndOneOtherwise) {
  const auto quiet = ampp::dist::LaunchOptions().nproc_per_node(2).verbose(false);
  EXPECT_EQ(ampp::dist::launch(quiet, {"sh", "-c", "exit 0"}), 0);
  // Rank 1 fails: launch reports it (on stderr) and returns torchrun's exit status 1.
  EXPECT_EQ(ampp::dist::launch(quiet, {"sh", "-c", "test \"$RANK\" != 1"}), 1);
  // The launcher's signal handlers are restored afterwards, so it can run again.
  EXPECT_EQ(ampp::dist::launch(quiet, {"true"}), 0);
}

// What the launcher's relay does: write the signal number into a pipe the parent reads.
int g_relay_fd = -1;
void relay_to_pipe(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_relay_fd, &byte, 1);
}

// CI once saw `launch` return 143 ("stopped by SIGTERM") when rank 1 failed: the teardown SIGTERM
// reached rank 0 between fork() and its handler reset, so rank 0 ran the launcher's handler and
// wrote into the launcher's pipe. A worker signalled before it is set up must die of the signal
// without running the parent's handler.
TEST(Launch, ASignalBeforeTheWorkerResetsItsHandlersNeverRunsTheLaunchersHandler) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
  g_relay_fd = fds[1];
  struct sigaction relay{}, previous{};
  relay.sa_handler = relay_to_pipe;
  sigemptyset(&relay.sa_mask);
  ASSERT_EQ(::sigaction(SIGTERM, &relay, &previous), 0);

  const pid_t pid = ampp::dist::detail::fork_with_signals_blocked({SIGTERM});
  if (pid == 0) {
    ::raise(SIGTERM);  // the teardown signal, arriving at the worst moment
    ampp::dist::detail::unblock_with_default_handlers({SIGTERM});
    ::_exit(0);  // not reached: the pending SIGTERM is delivered on unblocking
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::sigaction(SIGTERM, &previous, nullptr);
  unsigned char byte = 0;
  const ssize_t relayed = ::read(fds[0], &byte, 1);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "wait status " << status;
  EXPECT_EQ(relayed, -1) << "the child ran the parent's handler and relayed signal " << int(byte);
  // The parent's own mask is as before: SIGTERM is not left blocked.
  sigset_t now;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &now);
  EXPECT_FALSE(sigismember(&now, SIGTERM));
}

TEST(Launch, RejectsAnEmptyCommandLine) {
  AMPP_EXPECT_THROW_WITH(ampp::dist::launch(ampp::dist::LaunchOptions(), {}), "no program given");
}

}  // namespace
