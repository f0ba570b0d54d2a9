// ampp::dist::spawn: fork nprocs children, run fn(local_rank) in each, join, tear down on failure.
#include <ampp/dist/spawn.h>
#include <ampp/util/parse_number.h>
#include <ampp/util/threads.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <fmt/format.h>

#include "launcher_posix.h"

namespace ampp::dist {
namespace {

// A pipe holds 64 KiB; a child writes at most this much so that its write never blocks even if
// the parent is not reading yet.
constexpr size_t kMaxErrorBytes = 60000;

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = std::min(text.size(), kMaxErrorBytes);
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

std::string read_available(int fd) {
  std::string text;
  char buffer[4096];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF, or EAGAIN (non-blocking, a descendant still holds the write end)
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

// pthread OpenBLAS starts its thread pool when it is loaded and registers blas_thread_shutdown_
// as a fork "prepare" handler; it restarts the pool on its next threaded call. Looked up at run
// time: LibTorch may use another BLAS.
void stop_openblas_server_threads() {
  using Shutdown = int (*)();
  if (auto* shutdown = reinterpret_cast<Shutdown>(::dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"))) {
    shutdown();
  }
}

// Runs in the child after fork(); never returns.
[[noreturn]] void run_child(const std::function<void(int)>& fn, int local_rank, int nprocs, const std::string& addr,
                            int port, int threads, int parent_threads_if_clamped, int error_fd) {
  const std::string n = std::to_string(nprocs), r = std::to_string(local_rank);
  ::setenv("RANK", r.c_str(), 1);
  ::setenv("LOCAL_RANK", r.c_str(), 1);
  ::setenv("WORLD_SIZE", n.c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", n.c_str(), 1);
  ::setenv("MASTER_ADDR", addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  const std::string t = std::to_string(threads);
  ::setenv("OMP_NUM_THREADS", t.c_str(), 1);
  ::setenv("OPENBLAS_NUM_THREADS", t.c_str(), 1);
  if (parent_threads_if_clamped > 0 && local_rank == 0) {
    std::cerr << fmt::format(
        "ampp::dist::spawn: the parent already runs {} threads (LibTorch's OpenMP pool is not "
        "fork-safe), so each child uses 1 intra-op thread; call spawn before any LibTorch "
        "computation to give children more\n",
        parent_threads_if_clamped);
  }
  at::set_num_threads(threads);

  int code = 0;
  std::string error;
  try {
    fn(local_rank);
  } catch (const c10::Error& e) {
    error = std::string("c10::Error: ") + e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = c10::demangle(typeid(e).name()) + ": " + e.what();
  } catch (...) {
    error = "unknown exception (not derived from std::exception)";
  }
  if (!error.empty()) {
    write_all(error_fd, error);
    code = 1;
  }
  // Flush what fn printed, then leave without running the parent's atexit handlers and static
  // destructors (they belong to the parent: test frameworks, LibTorch's globals).
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace

namespace {

// What every child is given: the rendezvous address and its intra-op thread count.
struct SpawnPlan {
  std::string addr;
  int port = 0;
  int threads = 1;
  int parent_threads_if_clamped = 0;  // > 0: threads were clamped to 1 because the parent has threads
};

int master_port_from_env() {
  const std::string text = env_or("MASTER_PORT", "");
  if (text.empty()) return detail::find_free_port();
  const auto value = ampp::parse_int(text);
  TORCH_CHECK(value && *value >= 0 && *value <= 65535, "spawn: MASTER_PORT='", text,
              "' is not a port number (0..65535); unset it to let spawn pick a free port");
  return static_cast<int>(*value);
}

int threads_per_child(int nprocs, const SpawnOptions& options) {
  if (options.num_threads() > 0) return options.num_threads();
  const std::string omp = env_or("OMP_NUM_THREADS", "");
  if (omp.empty()) return ampp::threads_per_worker(nprocs);
  const auto value = ampp::parse_int(omp);
  TORCH_CHECK(value, "spawn: OMP_NUM_THREADS='", omp, "' is not an integer; unset it or give a thread count");
  return static_cast<int>(std::max<int64_t>(1, *value));
}

SpawnPlan plan_spawn(int nprocs, const SpawnOptions& options) {
  TORCH_CHECK(nprocs >= 1, "spawn: nprocs must be >= 1 (got ", nprocs,
              "); pass the number of processes to start, e.g. one per device");
  TORCH_CHECK(options.num_threads() >= 0, "spawn: num_threads must be >= 0 (got ", options.num_threads(),
              "); use 0 for max(1, cores / nprocs)");
  TORCH_CHECK(options.grace_period().count() >= 0, "spawn: grace_period must be >= 0");
  SpawnPlan plan;
  plan.addr = env_or("MASTER_ADDR", "127.0.0.1");
  plan.port = master_port_from_env();
  plan.threads = threads_per_child(nprocs, options);
  // See spawn.h: a child of a process with a running OpenMP pool hangs in parallel regions with
  // more than one thread; other threads (ours or the user's) are a sign that the pool may exist.
  // OpenBLAS's idle server threads are not: its fork handler stops them before every fork anyway,
  // so stop them first and do not let them cost the children their threads.
  stop_openblas_server_threads();
  const int parent_threads = detail::thread_count();
  if (parent_threads > 1 && plan.threads > 1) {
    plan.threads = 1;
    plan.parent_threads_if_clamped = parent_threads;
  }
  return plan;
}

// The children, the read ends of their error pipes and what each wrote there.
struct SpawnedChildren {
  std::vector<detail::Child> children;
  std::vector<int> error_fds;
  std::vector<std::string> errors;

  explicit SpawnedChildren(int n)
      : children(static_cast<size_t>(n)), error_fds(static_cast<size_t>(n), -1), errors(static_cast<size_t>(n)) {}
  ~SpawnedChildren() { close_fds(); }
  void close_fds() {
    for (int& fd : error_fds) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }
  void read_errors() {
    for (size_t i = 0; i < error_fds.size(); ++i)
      if (error_fds[i] >= 0) errors[i] += read_available(error_fds[i]);
  }
  [[noreturn]] void abort_start(const std::string& what) {
    detail::signal_groups(children, SIGKILL);
    detail::wait_or_kill(children, std::chrono::milliseconds(0));
    close_fds();
    TORCH_CHECK(false, "spawn: ", what);
  }
};

void fork_children(const std::function<void(int)>& fn, int nprocs, const SpawnPlan& plan, SpawnedChildren& spawned) {
  const pid_t parent = ::getpid();
  for (int i = 0; i < nprocs; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) spawned.abort_start(std::string("cannot create a pipe: ") + std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      for (int fd : spawned.error_fds)
        if (fd >= 0) ::close(fd);
      detail::become_worker_process(parent, SIGKILL);
      run_child(fn, i, nprocs, plan.addr, plan.port, plan.threads, plan.parent_threads_if_clamped, fds[1]);
    }
    ::close(fds[1]);
    if (pid < 0) {
      const int err = errno;
      ::close(fds[0]);
      spawned.abort_start(fmt::format("fork() failed for process {}: {}", i, std::strerror(err)));
    }
    ::setpgid(pid, pid);  // also done by the child; whichever runs first wins, no race
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    spawned.children[static_cast<size_t>(i)].pid = pid;
    spawned.error_fds[static_cast<size_t>(i)] = fds[0];
  }
}

// Waits for every child; the first failure tears the group down. Returns its index, or -1.
int join_children(SpawnedChildren& spawned, std::chrono::milliseconds grace_period) {
  int failed = -1;
  while (true) {
    std::vector<pollfd> polls;
    for (int fd : spawned.error_fds)
      if (fd >= 0) polls.push_back({fd, POLLIN, 0});
    ::poll(polls.data(), polls.size(), 20);
    spawned.read_errors();
    for (int i : detail::reap_exited(spawned.children))
      if (failed < 0 && spawned.children[static_cast<size_t>(i)].status != 0) failed = i;
    const bool all_done = std::none_of(spawned.children.begin(), spawned.children.end(),
                                       [](const detail::Child& c) { return c.running; });
    if (failed >= 0 || all_done) break;
  }
  if (failed >= 0) {
    detail::signal_groups(spawned.children, SIGTERM);
    detail::wait_or_kill(spawned.children, grace_period);
    // Leftover descendants of the children (their process groups) go too.
    detail::signal_groups(spawned.children, SIGKILL);
  }
  spawned.read_errors();
  spawned.close_fds();
  return failed;
}

[[noreturn]] void throw_child_failure(const SpawnedChildren& spawned, int failed) {
  const detail::Child& child = spawned.children[static_cast<size_t>(failed)];
  const std::string& error = spawned.errors[static_cast<size_t>(failed)];
  if (!error.empty()) {
    throw ProcessRaisedException(
        fmt::format("\n\n-- Process {} terminated with the following error:\n{}", failed, error), failed, child.pid);
  }
  if (WIFSIGNALED(child.status)) {
    const std::string name = detail::signal_name(WTERMSIG(child.status));
    throw ProcessExitedException(fmt::format("process {} terminated with signal {}", failed, name), failed, child.pid,
                                 -WTERMSIG(child.status), name);
  }
  const int code = WIFEXITED(child.status) ? WEXITSTATUS(child.status) : 1;
  throw ProcessExitedException(fmt::format("process {} terminated with exit code {}", failed, code), failed, child.pid,
                               code, "");
}

}  // namespace

void spawn_local_ranks(const std::function<void(int)>& fn, int nprocs, const SpawnOptions& options) {
  const SpawnPlan plan = plan_spawn(nprocs, options);
  // Anything still buffered would be printed once by every child as well.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  SpawnedChildren spawned(nprocs);
  fork_children(fn, nprocs, plan, spawned);
  const int failed = join_children(spawned, options.grace_period());
  if (failed >= 0) throw_child_failure(spawned, failed);
}

}  // namespace ampp::dist
