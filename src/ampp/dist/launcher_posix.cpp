#include "launcher_posix.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <c10/util/Exception.h>

namespace ampp::dist::detail {

int find_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TORCH_CHECK(fd >= 0, "cannot create a socket to look for a free port: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  TORCH_CHECK(ok, "cannot find a free TCP port: ", std::strerror(err),
              "; pass a port explicitly (MASTER_PORT or LaunchOptions::master_port)");
  return ntohs(addr.sin_port);
}

std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) return "signal " + signal_name(WTERMSIG(status));
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  return "wait status " + std::to_string(status);
}

int thread_count() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return 1;
  int n = 0;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return std::max(1, n);
}

void become_worker_process(pid_t parent, int death_signal) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, death_signal);
  // The parent may have died between fork() and prctl(): then nobody would signal us.
  if (::getppid() != parent) ::_exit(128 + death_signal);
}

pid_t fork_with_signals_blocked(const std::vector<int>& signals) {
  sigset_t block, previous;
  sigemptyset(&block);
  for (int sig : signals) sigaddset(&block, sig);
  ::pthread_sigmask(SIG_BLOCK, &block, &previous);
  const pid_t pid = ::fork();
  const int fork_errno = errno;
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  errno = fork_errno;
  return pid;
}

void unblock_with_default_handlers(const std::vector<int>& signals) {
  for (int sig : signals) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
}

std::vector<int> reap_exited(std::vector<Child>& children) {
  std::vector<int> reaped;
  for (size_t i = 0; i < children.size(); ++i) {
    Child& child = children[i];
    if (!child.running) continue;
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(child.pid, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == child.pid || (r < 0 && errno == ECHILD)) {
      // ECHILD: somebody else reaped it (e.g. a SIGCHLD=SIG_IGN setting); report it as failed.
      child.running = false;
      child.status = r == child.pid ? status : (1 << 8);
      reaped.push_back(static_cast<int>(i));
    }
  }
  return reaped;
}

void signal_groups(const std::vector<Child>& children, int sig) {
  for (const Child& child : children) {
    if (child.pid <= 0) continue;
    // The parent also called setpgid(pid, pid) right after fork, so the group exists as soon as
    // the child does; fall back to the pid itself if the group is somehow gone.
    if (::kill(-child.pid, sig) != 0 && child.running) ::kill(child.pid, sig);
  }
}

bool wait_or_kill(std::vector<Child>& children, std::chrono::milliseconds grace) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + grace;
  auto any_running = [&] {
    return std::any_of(children.begin(), children.end(), [](const Child& c) { return c.running; });
  };
  while (true) {
    reap_exited(children);
    if (!any_running()) return true;
    if (clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  signal_groups(children, SIGKILL);
  while (any_running()) {
    reap_exited(children);
    if (any_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace ampp::dist::detail
