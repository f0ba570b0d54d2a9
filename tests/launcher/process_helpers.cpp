#include "process_helpers.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace ampp_test {

using Clock = std::chrono::steady_clock;

int RunResult::exit_code() const {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::vector<std::string> environment_with(const std::map<std::string, std::optional<std::string>>& changes) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (changes.count(key) == 0) env.push_back(entry);
  }
  for (const auto& [key, value] : changes) {
    if (value) env.push_back(key + "=" + *value);
  }
  return env;
}

namespace {

// A started command: its pid, start time and output files.
struct Started {
  pid_t pid = -1;
  Clock::time_point start;
  std::string out_path, err_path;
};

Started start_command(const std::vector<std::string>& argv, const std::vector<std::string>& env, const TempDir& dir,
                      const std::string& tag) {
  Started s;
  s.out_path = dir.file("stdout." + tag);
  s.err_path = dir.file("stderr." + tag);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  s.start = Clock::now();
  s.pid = ::fork();
  if (s.pid == 0) {
    ::setpgid(0, 0);  // so a timeout can kill the command and everything it started
    const int out = ::open(s.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(s.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  if (s.pid < 0) throw std::runtime_error("fork failed");
  ::setpgid(s.pid, s.pid);
  return s;
}

// Waits for a started command until `deadline`; then SIGKILLs its process group.
RunResult finish_command(const Started& s, Clock::time_point deadline) {
  RunResult result;
  while (true) {
    const pid_t r = ::waitpid(s.pid, &result.status, WNOHANG);
    if (r == s.pid) break;
    if (Clock::now() >= deadline) {
      result.timed_out = true;
      ::kill(-s.pid, SIGKILL);
      ::waitpid(s.pid, &result.status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - s.start).count();
  result.out = read_file(s.out_path);
  result.err = read_file(s.err_path);
  return result;
}

}  // namespace

RunResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      std::chrono::milliseconds timeout, const std::function<void(pid_t)>& during) {
  TempDir dir;
  const Started s = start_command(argv, env, dir, "0");
  if (during) during(s.pid);
  return finish_command(s, s.start + timeout);
}

std::vector<RunResult> run_commands(const std::vector<std::vector<std::string>>& argvs,
                                    const std::vector<std::string>& env, std::chrono::milliseconds timeout) {
  TempDir dir;
  std::vector<Started> started;
  for (size_t i = 0; i < argvs.size(); ++i) {
    started.push_back(start_command(argvs[i], env, dir, std::to_string(i)));
  }
  std::vector<RunResult> results;
  const auto deadline = Clock::now() + timeout;
  for (const Started& s : started) results.push_back(finish_command(s, deadline));
  return results;
}

bool process_alive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  // /proc/<pid>/stat: "pid (comm) S ..."; the state follows the last ')'.
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  return stat[paren + 2] != 'Z';
}

bool wait_for_files(const std::vector<std::string>& paths, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (std::all_of(paths.begin(), paths.end(), [](const std::string& p) { return std::filesystem::exists(p); })) {
      return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool wait_until_dead(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (std::none_of(pids.begin(), pids.end(), process_alive)) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::map<std::string, std::string> read_key_values(const std::string& path) {
  std::map<std::string, std::string> values;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return values;
}

int expected_threads(int procs) {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  return std::max(1, CPU_COUNT(&set) / procs);
}

}  // namespace ampp_test
