// The `ampp run` launcher: a static-rendezvous torchrun. One attempt = start every local worker,
// stream their output, wait; the first failure tears the group down (SIGTERM, then SIGKILL after
// the grace period); a failed attempt is retried while restarts are left.
#include <ampp/dist/launcher.h>
#include <ampp/util/threads.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "launcher_posix.h"
#include "stall_watch.h"

extern char** environ;

namespace ampp::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDefaultMultiNodePort = 29500;  // torchrun's --master-port default
constexpr size_t kMaxLineBytes = 64 * 1024;   // longer lines are split (never buffered unbounded)

// ---- signals: SIGINT/SIGTERM/SIGHUP to the launcher are written to a self-pipe and forwarded ----

std::atomic<int> g_signal_pipe{-1};

void on_signal(int sig) {
  const int saved = errno;
  const int fd = g_signal_pipe.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    [[maybe_unused]] ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved;
}

// Installs the relay for the lifetime of one launch() and restores the previous handlers after.
class SignalRelay {
 public:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

  SignalRelay() {
    int fds[2];
    TORCH_CHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0, "launch: cannot create a pipe: ", std::strerror(errno));
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    int expected = -1;
    TORCH_CHECK(g_signal_pipe.compare_exchange_strong(expected, write_fd_),
                "ampp::dist::launch is already running in this process; launch one group at a time");
    struct sigaction action{};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &action, &previous_[i]);
  }
  ~SignalRelay() {
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
    g_signal_pipe.store(-1);
    ::close(read_fd_);
    ::close(write_fd_);
  }
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  int fd() const { return read_fd_; }
  // The last signal received since the previous call, or 0.
  int take() const {
    unsigned char bytes[64];
    int sig = 0;
    ssize_t n;
    while ((n = ::read(read_fd_, bytes, sizeof(bytes))) > 0) sig = bytes[n - 1];
    return sig;
  }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction previous_[std::size(kSignals)]{};
};

// ---- output: one prefixed line at a time, so ranks never interleave inside a line ----

void write_fully(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the launcher's own output is gone; keep supervising anyway
    p += n;
    left -= static_cast<size_t>(n);
  }
}

class LineStream {
 public:
  LineStream(int fd, int out_fd, std::string prefix) : fd_(fd), out_fd_(out_fd), prefix_(std::move(prefix)) {}
  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }

  // Reads what is available (non-blocking) and writes out every complete line.
  void pump() {
    char buffer[16384];
    while (fd_ >= 0) {
      const ssize_t n = ::read(fd_, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;  // EAGAIN: nothing more for now
      if (n == 0) {      // EOF: every writer is gone
        close();
        break;
      }
      pending_.append(buffer, static_cast<size_t>(n));
      emit_lines();
    }
  }
  // Writes out an unterminated last line and stops reading.
  void close() {
    if (!pending_.empty()) {
      write_fully(out_fd_, prefix_ + pending_ + "\n");
      pending_.clear();
    }
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  void emit_lines() {
    std::string out;
    size_t start = 0;
    while (true) {
      const size_t end = pending_.find('\n', start);
      if (end == std::string::npos) break;
      out += prefix_;
      out.append(pending_, start, end - start + 1);
      start = end + 1;
    }
    pending_.erase(0, start);
    if (pending_.size() >= kMaxLineBytes) {
      out += prefix_ + pending_ + "\n";
      pending_.clear();
    }
    if (!out.empty()) write_fully(out_fd_, out);
  }

  int fd_;
  int out_fd_;
  std::string prefix_;
  std::string pending_;
};

// ---- program lookup and environment ----

bool is_executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

// Checks up front that the program exists, for a clear error instead of N "exit code 127"s.
void check_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    TORCH_CHECK(is_executable(program), "cannot execute '", program, "': ", std::strerror(errno),
                "; check the path and that the file is executable");
    return;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    if (is_executable(dir + "/" + program)) return;
    start = end + 1;
  }
  TORCH_CHECK(false, "program '", program, "' not found in PATH; give its path (e.g. ./", program, ")");
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct Plan {
  LaunchOptions options;
  std::vector<std::string> argv;
  int port = 0;
  int world_size = 0;
  std::map<std::string, std::string> base_env;  // launcher environment + job-wide variables
};

std::vector<std::string> worker_env(const Plan& plan, int local_rank, int restart_count,
                                    const std::string& heartbeat_file) {
  const LaunchOptions& o = plan.options;
  const int rank = o.node_rank() * o.nproc_per_node() + local_rank;
  std::map<std::string, std::string> env = plan.base_env;
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["RANK"] = std::to_string(rank);
  env["GROUP_RANK"] = std::to_string(o.node_rank());
  env["ROLE_RANK"] = std::to_string(rank);  // one role ("default") spanning all workers
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart_count);
  if (!heartbeat_file.empty()) env["AMPP_HEARTBEAT_FILE"] = heartbeat_file;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

// ---- one attempt ----

struct Worker {
  int local_rank = 0;
  int rank = 0;
  std::optional<LineStream> out, err;
};

struct AttemptResult {
  int failed = -1;        // index of the first worker that failed, -1 if none
  int failed_status = 0;  // its wait status
  pid_t failed_pid = -1;
  std::string stalled;      // why the failed worker counts as stalled ("" if it exited)
  std::string failed_step;  // " (last reported step S)" from its heartbeat, or ""
  int interrupted_by = 0;   // signal received by the launcher, 0 if none
};

void say(const LaunchOptions& o, const std::string& message) {
  if (o.verbose()) write_fully(STDERR_FILENO, "ampp run: " + message + "\n");
}

// The launcher's signals plus SIGPIPE: blocked across fork(), default in the worker.
const std::vector<int> kWorkerDefaultSignals{SIGINT, SIGTERM, SIGHUP, SIGPIPE};

[[noreturn]] void exec_worker(const Plan& plan, const std::vector<std::string>& env, int out_fd, int err_fd) {
  detail::unblock_with_default_handlers(kWorkerDefaultSignals);
  const int null_fd = ::open("/dev/null", O_RDONLY);
  // Workers sit in their own process group (so the launcher can signal all their descendants);
  // reading the terminal from there would stop them with SIGTTIN, so stdin is /dev/null.
  if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(err_fd, STDERR_FILENO);
  std::vector<char*> args, envp;
  for (const auto& a : plan.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  ::execvpe(args[0], args.data(), envp.data());
  const std::string message = fmt::format("ampp run: cannot execute '{}': {}\n", plan.argv[0], std::strerror(errno));
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, message.data(), message.size());
  ::_exit(127);
}

// One attempt's workers: their output streams, the processes (children[i] is workers[i]) and how
// far the teardown has got.
struct Attempt {
  std::vector<Worker> workers;
  std::vector<detail::Child> children;
  AttemptResult result;
  std::optional<Clock::time_point> kill_at;  // set once the teardown has started
  bool killed = false;

  void start_teardown(int sig, std::chrono::milliseconds grace) {
    detail::signal_groups(children, sig);
    detail::signal_groups(children, SIGCONT);  // a stopped worker can only act on `sig` once continued
    if (!kill_at) kill_at = Clock::now() + grace;
  }
  bool all_done() const {
    return std::none_of(children.begin(), children.end(), [](const detail::Child& c) { return c.running; });
  }
};

void start_worker(const Plan& plan, int local_rank, int restart_count, pid_t launcher, Attempt& attempt,
                  const std::string& heartbeat_file) {
  const LaunchOptions& o = plan.options;
  Worker& w = attempt.workers[static_cast<size_t>(local_rank)];
  w.local_rank = local_rank;
  w.rank = o.node_rank() * o.nproc_per_node() + local_rank;
  const std::vector<std::string> env = worker_env(plan, local_rank, restart_count, heartbeat_file);
  int out[2], err[2];
  TORCH_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0,
              "launch: cannot create pipes: ", std::strerror(errno));
  const pid_t pid = detail::fork_with_signals_blocked(kWorkerDefaultSignals);
  if (pid == 0) {
    detail::become_worker_process(launcher, SIGKILL);
    exec_worker(plan, env, out[1], err[1]);  // dup2 clears CLOEXEC on fds 1 and 2 only
  }
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(err[0]);
    detail::signal_groups(attempt.children, SIGKILL);
    detail::wait_or_kill(attempt.children, std::chrono::milliseconds(0));
    TORCH_CHECK(false, "launch: fork() failed for local rank ", local_rank, ": ", std::strerror(e));
  }
  ::setpgid(pid, pid);
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  const std::string prefix = o.prefix_output() ? fmt::format("[rank{}]: ", w.rank) : "";
  attempt.children[static_cast<size_t>(local_rank)].pid = pid;
  w.out.emplace(out[0], STDOUT_FILENO, prefix);
  w.err.emplace(err[0], STDERR_FILENO, prefix);
}

// Waits up to 50 ms for output or a signal; copies the output and forwards the signal.
void pump_once(const LaunchOptions& o, const SignalRelay& signals, Attempt& attempt) {
  std::vector<pollfd> polls{{signals.fd(), POLLIN, 0}};
  for (const auto& w : attempt.workers) {
    if (w.out->open()) polls.push_back({w.out->fd(), POLLIN, 0});
    if (w.err->open()) polls.push_back({w.err->fd(), POLLIN, 0});
  }
  ::poll(polls.data(), polls.size(), 50);
  if (const int sig = signals.take(); sig != 0) {
    if (attempt.result.interrupted_by == 0) {
      attempt.result.interrupted_by = sig;
      say(o, fmt::format("received {}; forwarding it to the workers", detail::signal_name(sig)));
    }
    attempt.start_teardown(sig, o.shutdown_grace());
  }
  for (auto& w : attempt.workers) {
    w.out->pump();
    w.err->pump();
  }
}

// Reaps exited workers; the first failure (before any teardown) stops the others.
void reap_workers(const LaunchOptions& o, Attempt& attempt, const detail::StallWatch& watch) {
  AttemptResult& result = attempt.result;
  for (int i : detail::reap_exited(attempt.children)) {
    const detail::Child& c = attempt.children[static_cast<size_t>(i)];
    if (c.status == 0 || result.failed >= 0 || result.interrupted_by != 0 || attempt.kill_at) continue;
    result.failed = i;
    result.failed_status = c.status;
    result.failed_pid = c.pid;
    result.failed_step = watch.last_step_text(i);
    say(o, fmt::format("worker rank {} (local rank {}, pid {}) failed with {}{}; stopping the other workers",
                       attempt.workers[static_cast<size_t>(i)].rank, i, c.pid, detail::describe_wait_status(c.status),
                       result.failed_step));
    attempt.start_teardown(SIGTERM, o.shutdown_grace());
  }
  if (attempt.kill_at && !attempt.killed && !attempt.all_done() && Clock::now() >= *attempt.kill_at) {
    say(o,
        fmt::format("workers still running {} ms after the stop signal; sending SIGKILL", o.shutdown_grace().count()));
    detail::signal_groups(attempt.children, SIGKILL);
    attempt.killed = true;
  }
}

// A worker silent for LaunchOptions::stall_timeout fails the attempt like a crashed one.
void check_stalls(const LaunchOptions& o, detail::StallWatch& watch, Attempt& attempt) {
  if (attempt.result.failed >= 0 || attempt.result.interrupted_by != 0 || attempt.kill_at) return;
  std::vector<pid_t> pids;
  for (const auto& c : attempt.children) pids.push_back(c.running ? c.pid : -1);
  const auto stall = watch.check(pids);
  if (!stall) return;
  AttemptResult& result = attempt.result;
  result.failed = stall->local_index;
  result.failed_pid = pids[static_cast<size_t>(stall->local_index)];
  result.stalled = stall->cause;
  say(o, fmt::format("worker rank {} (local rank {}, pid {}) {}; stopping the other workers",
                     attempt.workers[static_cast<size_t>(stall->local_index)].rank, stall->local_index,
                     result.failed_pid, stall->cause));
  attempt.start_teardown(SIGTERM, o.shutdown_grace());
}

AttemptResult run_attempt(const Plan& plan, int restart_count, const SignalRelay& signals, detail::StallWatch& watch) {
  const LaunchOptions& o = plan.options;
  const pid_t launcher = ::getpid();
  Attempt attempt;
  attempt.workers.resize(static_cast<size_t>(o.nproc_per_node()));
  attempt.children.resize(static_cast<size_t>(o.nproc_per_node()));
  watch.reset();
  for (int i = 0; i < o.nproc_per_node(); ++i) start_worker(plan, i, restart_count, launcher, attempt, watch.file(i));
  while (!attempt.all_done()) {
    pump_once(o, signals, attempt);
    reap_workers(o, attempt, watch);
    check_stalls(o, watch, attempt);
  }
  // Every worker is reaped: print what is left in the pipes. Descendants of a worker may still
  // hold a pipe open; we do not wait for them.
  for (auto& w : attempt.workers) {
    w.out->pump();
    w.err->pump();
    w.out->close();
    w.err->close();
  }
  if (attempt.result.failed >= 0 || attempt.result.interrupted_by != 0)
    detail::signal_groups(attempt.children, SIGKILL);  // leftover descendants of the workers
  return attempt.result;
}

}  // namespace

void validate(const LaunchOptions& o) {
  TORCH_CHECK(o.nproc_per_node() >= 1, "LaunchOptions::nproc_per_node must be >= 1 (got ", o.nproc_per_node(),
              "): it is the number of worker processes to start on this node, e.g. 2");
  TORCH_CHECK(o.nnodes() >= 1, "LaunchOptions::nnodes must be >= 1 (got ", o.nnodes(),
              "): it is the number of nodes (machines) in the job");
  TORCH_CHECK(o.node_rank() >= 0 && o.node_rank() < o.nnodes(), "LaunchOptions::node_rank ", o.node_rank(),
              " is out of range for LaunchOptions::nnodes ", o.nnodes(), ": give each node a distinct rank in 0..",
              o.nnodes() - 1);
  TORCH_CHECK(o.master_port() >= 0 && o.master_port() <= 65535, "LaunchOptions::master_port ", o.master_port(),
              " is out of range: use a TCP port in 1..65535 (on a single node, omit it to pick a free one)");
  TORCH_CHECK(!o.master_addr().empty(),
              "LaunchOptions::master_addr is empty: give the address of the node with node rank 0");
  TORCH_CHECK(o.max_restarts() >= 0, "LaunchOptions::max_restarts must be >= 0 (got ", o.max_restarts(), ")");
  TORCH_CHECK(o.stall_timeout().count() >= 0, "LaunchOptions::stall_timeout must be 0 (off) or positive (got ",
              o.stall_timeout().count(), " ms)");
  TORCH_CHECK(o.shutdown_grace().count() >= 0, "the shutdown grace period must be >= 0 (got ",
              o.shutdown_grace().count(), " ms)");
  TORCH_CHECK(static_cast<long long>(o.nproc_per_node()) * o.nnodes() <= 1 << 24,
              "LaunchOptions::nproc_per_node x LaunchOptions::nnodes is implausibly large (", o.nproc_per_node(), " x ",
              o.nnodes(), ")");
}

namespace {

// The environment every worker starts from: the launcher's own plus torchrun's variables.
void set_worker_environment(Plan& plan) {
  const LaunchOptions& options = plan.options;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) plan.base_env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  auto& env = plan.base_env;
  env["WORLD_SIZE"] = std::to_string(plan.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(options.nproc_per_node());
  env["GROUP_WORLD_SIZE"] = std::to_string(options.nnodes());
  env["ROLE_NAME"] = "default";
  env["ROLE_WORLD_SIZE"] = std::to_string(plan.world_size);
  env["MASTER_ADDR"] = options.master_addr();
  env["MASTER_PORT"] = std::to_string(plan.port);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options.max_restarts());
  env["TORCHELASTIC_RUN_ID"] = options.run_id();
  // No agent-hosted store here: PyTorch workers must create the TCPStore themselves (rank 0).
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  env.emplace("NCCL_ASYNC_ERROR_HANDLING", "1");
  const int threads = ampp::threads_per_worker(options.nproc_per_node());
  std::vector<std::string> set_threads;
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (env.emplace(name, std::to_string(threads)).second) set_threads.push_back(fmt::format("{}={}", name, threads));
  }
  if (!set_threads.empty()) {
    say(options, fmt::format("setting {} for each worker ({} usable cores / {} workers on this node) so the "
                             "workers do not oversubscribe the cores; set it in the environment to override",
                             fmt::join(set_threads, " and "), ampp::usable_cores(), options.nproc_per_node()));
  }
}

Plan make_plan(const LaunchOptions& options, std::vector<std::string> argv) {
  TORCH_CHECK(!argv.empty() && !argv[0].empty(), "no program given; usage: ampp run [options] -- <program> [args...]");
  if (ends_with(argv[0], ".py")) {  // torchrun runs scripts as `python -u script args...`
    const char* python = std::getenv("PYTHON_EXEC");
    argv.insert(argv.begin(), {python != nullptr && *python != '\0' ? python : "python3", "-u"});
  }
  check_program(argv[0]);
  Plan plan;
  plan.options = options;
  plan.argv = std::move(argv);
  plan.world_size = options.nproc_per_node() * options.nnodes();
  // Without a port: a free one on a single node; torchrun's fixed default when other nodes must
  // agree on it.
  plan.port = options.master_port() != 0 ? options.master_port()
              : options.nnodes() == 1    ? detail::find_free_port()
                                         : kDefaultMultiNodePort;
  set_worker_environment(plan);
  return plan;
}

// What an attempt's end means for the job: an exit code, or nullopt to restart the worker group.
std::optional<int> attempt_outcome(const LaunchOptions& options, const AttemptResult& r, int attempt) {
  if (r.interrupted_by != 0) {
    write_fully(STDERR_FILENO, fmt::format("ampp run: stopped by {}; all workers terminated\n",
                                           detail::signal_name(r.interrupted_by)));
    return 128 + r.interrupted_by;
  }
  if (r.failed < 0) {
    say(options, "all workers finished successfully");
    return 0;
  }
  const int rank = options.node_rank() * options.nproc_per_node() + r.failed;
  const std::string cause = fmt::format(
      "worker rank {} (local rank {}, pid {}) {}", rank, r.failed, r.failed_pid,
      r.stalled.empty() ? "failed with " + detail::describe_wait_status(r.failed_status) + r.failed_step : r.stalled);
  const int left = options.max_restarts() - attempt;
  if (left > 0) {
    say(options, fmt::format("worker group FAILED: {}; {}/{} restarts left, restarting the worker group", cause, left,
                             options.max_restarts()));
    return std::nullopt;
  }
  write_fully(
      STDERR_FILENO,
      fmt::format("ampp run: error: {}{}; the worker group was terminated\n", cause,
                  options.max_restarts() > 0 ? fmt::format(" (after {} restarts)", options.max_restarts()) : ""));
  return 1;
}

}  // namespace

int launch(const LaunchOptions& options, std::vector<std::string> argv) {
  validate(options);
  const Plan plan = make_plan(options, std::move(argv));
  SignalRelay signals;
  detail::StallWatch watch(options.nproc_per_node(), options.stall_timeout());
  for (int attempt = 0;; ++attempt) {
    say(options, fmt::format("starting {} worker{} on node {}/{} (world size {}, master {}:{}, restart {}/{}): {}",
                             options.nproc_per_node(), options.nproc_per_node() > 1 ? "s" : "", options.node_rank(),
                             options.nnodes(), plan.world_size, options.master_addr(), plan.port, attempt,
                             options.max_restarts(), fmt::join(plan.argv, " ")));
    if (const auto code = attempt_outcome(options, run_attempt(plan, attempt, signals, watch), attempt)) return *code;
  }
}

}  // namespace ampp::dist
