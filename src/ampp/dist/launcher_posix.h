#pragma once
// POSIX process plumbing shared by ampp::dist::spawn and the `ampp run` launcher (Linux only):
// free ports, wait-status descriptions, process-group teardown.
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace ampp::dist::detail {

// An ephemeral TCP port that was free a moment ago (bind to port 0, read it back, close). Another
// process can still take it before the rendezvous binds it; the window is tiny (torchrun's
// --standalone has the same one).
int find_free_port();

// "SIGKILL" for SIGKILL, "signal 77" for numbers without a name.
std::string signal_name(int sig);

// "exit code 3" or "signal SIGKILL" for a waitpid() status.
std::string describe_wait_status(int status);

// Number of threads of the calling process (entries of /proc/self/task).
int thread_count();

// Child side, right after fork(): become the leader of a new process group (so the parent can
// signal the child and everything it starts at once) and die with `death_signal` when the parent
// dies (prctl PR_SET_PDEATHSIG). `parent` is the pid the parent had before fork(): if it is already
// gone, the child exits at once instead of running as an orphan.
void become_worker_process(pid_t parent, int death_signal);

// fork() with `signals` blocked in the calling thread. Without it, a signal that reaches the child
// before it has reset its handlers runs the parent's handler in the child: the launcher's handler
// writes into a pipe the child shares with it, so a worker's teardown SIGTERM would read as a
// SIGTERM to the launcher. Parent: the previous mask is back before this returns. Child: returns
// with `signals` still blocked; call unblock_with_default_handlers(signals) once set up.
pid_t fork_with_signals_blocked(const std::vector<int>& signals);

// Child side: default dispositions for `signals`, then an empty signal mask (in that order, so a
// signal that arrived in between gets its default action, never the parent's handler).
void unblock_with_default_handlers(const std::vector<int>& signals);

// A child process started by the parent, tracked until reaped.
struct Child {
  pid_t pid = -1;
  bool running = true;
  int status = 0;  // waitpid() status once reaped
};

// Reaps every child that has exited (waitpid WNOHANG on each pid; never touches other children of
// the process). Returns the indices of the children reaped by this call, in index order.
std::vector<int> reap_exited(std::vector<Child>& children);

// Sends `sig` to the process group of every child (including children already reaped, to catch
// their leftover descendants). ESRCH (group gone) is not an error.
void signal_groups(const std::vector<Child>& children, int sig);

// Waits until every child is reaped, at most `grace`; then SIGKILLs the groups of the survivors
// and reaps them too. Returns true when everybody exited within the grace period.
bool wait_or_kill(std::vector<Child>& children, std::chrono::milliseconds grace);

}  // namespace ampp::dist::detail
