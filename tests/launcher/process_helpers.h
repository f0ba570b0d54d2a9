#pragma once
// Helpers for tests that start real processes: run a command with a hard timeout and captured
// output, check whether a pid is still alive, temporary directories.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ampp_test.h"

namespace ampp_test {

struct RunResult {
  int status = 0;          // waitpid status
  bool timed_out = false;  // killed by run_command after the timeout
  double seconds = 0;      // wall time until the command exited
  std::string out, err;
  int exit_code() const;  // exit code, or 128 + signal
};

// The current environment with some variables replaced (value) or removed (nullopt).
std::vector<std::string> environment_with(const std::map<std::string, std::optional<std::string>>& changes);

// Runs argv with `env`, stdout/stderr to files. `during(pid)` runs while the command runs (it may
// kill it or its children). After `timeout` the command's whole process group is SIGKILLed.
RunResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      std::chrono::milliseconds timeout, const std::function<void(pid_t)>& during = {});

// Runs several commands at the same time (each as run_command without `during`) and returns
// their results in order: independent checks then cost one process start-up, not N.
std::vector<RunResult> run_commands(const std::vector<std::vector<std::string>>& argvs,
                                    const std::vector<std::string>& env, std::chrono::milliseconds timeout);

// Alive = exists and is not a zombie (a zombie re-parented to a non-reaping init counts as gone).
bool process_alive(pid_t pid);

// Waits until every file exists (true) or the timeout passes (false).
bool wait_for_files(const std::vector<std::string>& paths, std::chrono::milliseconds timeout);

// Waits until none of the pids is alive (true) or the timeout passes (false).
bool wait_until_dead(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout);

// "KEY=VALUE" lines of a file as a map.
std::map<std::string, std::string> read_key_values(const std::string& path);

// max(1, usable cores / procs), computed independently of ampp.
int expected_threads(int procs);

}  // namespace ampp_test
