#pragma once
// ampp::dist::spawn: torch.multiprocessing.spawn for C++. Runs fn(local_rank, args...) in nprocs
// forked child processes with the rendezvous environment set, joins them, and if one fails
// terminates the others and throws an exception naming the failing rank and how it failed.
//
//   void main_worker(int gpu, int ngpus_per_node, Args args);       // seed 000's main_worker
//   ampp::dist::spawn(main_worker, ngpus_per_node, ngpus_per_node, args);
//
// Each child gets RANK = LOCAL_RANK = i, WORLD_SIZE = LOCAL_WORLD_SIZE = nprocs, MASTER_ADDR (the
// parent's, else 127.0.0.1) and MASTER_PORT (the parent's, else a free port picked once for all
// children), so `ampp::dist::init_process_group()` (env://) works inside fn unchanged.
//
// fork() caveat: the children are forked copies of the caller, not fresh programs (Python's mp.spawn
// starts fresh interpreters). GNU OpenMP (LibTorch's intra-op pool here) is not fork-safe: a child
// of a process whose OpenMP pool was already started hangs in its first parallel region. Call spawn
// before any LibTorch computation (as the seeds do). If the caller already runs other threads at the
// time of fork, spawn limits each child to 1 intra-op thread (and says so on stderr) instead of
// letting it hang. It cannot help with a thread that is busy inside a library (holding one of its
// locks) at the moment of fork: the child inherits that lock held forever. Start other threads
// after spawn, or make sure they are idle while it forks.
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <torch/arg.h>

namespace ampp::dist {

struct SpawnOptions {
  // Intra-op threads per child (at::set_num_threads, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS).
  // 0: OMP_NUM_THREADS if the parent has it, else max(1, usable cores / nprocs).
  TORCH_ARG(int, num_threads) = 0;
  // After the first failure: time the other children get between SIGTERM and SIGKILL.
  TORCH_ARG(std::chrono::milliseconds, grace_period) = std::chrono::milliseconds(5000);
};

// Base of the errors spawn throws (torch.multiprocessing.ProcessException): which child failed.
class ProcessException : public std::runtime_error {
 public:
  ProcessException(const std::string& message, int error_index, int pid)
      : std::runtime_error(message), error_index_(error_index), pid_(pid) {}
  int error_index() const { return error_index_; }  // the failing child's local rank
  int pid() const { return pid_; }

 private:
  int error_index_;
  int pid_;
};

// fn threw: "\n\n-- Process 1 terminated with the following error:\n<type>: <what()>".
class ProcessRaisedException : public ProcessException {
 public:
  using ProcessException::ProcessException;
};

// The child exited non-zero or was killed: "process 1 terminated with exit code 3" or
// "process 1 terminated with signal SIGKILL". exit_code() is the code, or -signal as in Python.
class ProcessExitedException : public ProcessException {
 public:
  ProcessExitedException(const std::string& message, int error_index, int pid, int exit_code, std::string signal_name)
      : ProcessException(message, error_index, pid), exit_code_(exit_code), signal_name_(std::move(signal_name)) {}
  int exit_code() const { return exit_code_; }
  const std::string& signal_name() const { return signal_name_; }  // "" for a plain exit

 private:
  int exit_code_;
  std::string signal_name_;
};

// The untemplated core: fn(local_rank) in nprocs children.
void spawn_local_ranks(const std::function<void(int)>& fn, int nprocs, const SpawnOptions& options);

// mp.spawn(fn, args=(args...), nprocs=nprocs): fn(i, args...) for i in [0, nprocs). The args are
// copied into every child by fork(), so references and pointers stay valid there (but changes a
// child makes are not seen by the parent or the other children).
template <typename Fn, typename... Args, typename = std::enable_if_t<!std::is_same_v<std::decay_t<Fn>, SpawnOptions>>>
void spawn(Fn&& fn, int nprocs, Args&&... args) {
  spawn_local_ranks([&](int local_rank) { std::invoke(fn, local_rank, args...); }, nprocs, SpawnOptions());
}

// The same with explicit options.
template <typename Fn, typename... Args>
void spawn(const SpawnOptions& options, Fn&& fn, int nprocs, Args&&... args) {
  spawn_local_ranks([&](int local_rank) { std::invoke(fn, local_rank, args...); }, nprocs, options);
}

}  // namespace ampp::dist
