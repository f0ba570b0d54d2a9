#include "stall_watch.h"

#include <ampp/util/remove_tree.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace ampp::dist::detail {
namespace {

// A worker's last report: seconds since it and the step (-1: never reported).
struct Beat {
  double silent_seconds = 0;
  int64_t step = -1;
};

Beat read_beat(const std::string& path) {
  struct stat st{};
  Beat beat;
  if (::stat(path.c_str(), &st) != 0 || st.st_size == 0) return beat;
  const auto mtime =
      std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
  beat.silent_seconds = std::chrono::duration<double>(std::chrono::system_clock::now() - mtime).count();
  std::ifstream in(path);
  long long step = -1;
  if (in >> step) beat.step = step;
  return beat;
}

// The scheduler state letter of /proc/<pid>/stat ('R', 'S', 'D', 'T', ...), '?' if unknown.
char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may itself contain ')' or spaces
  return close != std::string::npos && close + 2 < text.size() ? text[close + 2] : '?';
}

std::string describe_state(char state) {
  switch (state) {
    case 'T':
      return "the process is stopped (SIGSTOP or SIGTSTP)";
    case 't':
      return "the process is stopped by a debugger";
    case 'R':
      return "the process is running but not progressing (a busy loop?)";
    case 'S':
      return "the process is sleeping (waiting for a peer, a lock or I/O)";
    case 'D':
      return "the process is in uninterruptible I/O (a disk or network file system)";
    default:
      return "the process state is unknown";
  }
}

// How likely a worker in this state is the cause rather than a victim waiting for it.
int suspicion(char state) { return state == 'T' || state == 't' ? 2 : state == 'R' || state == 'D' ? 1 : 0; }

}  // namespace

StallWatch::StallWatch(int workers, std::chrono::milliseconds timeout) : workers_(workers), timeout_(timeout) {
  if (timeout_.count() == 0) return;
  std::string templ = (fs::temp_directory_path() / "ampp-heartbeat-XXXXXX").string();
  TORCH_CHECK(::mkdtemp(templ.data()) != nullptr, "launch: cannot create a heartbeat folder in ",
              fs::temp_directory_path().string(), "; set TMPDIR to a writable folder");
  dir_ = templ;
  reset();
}

StallWatch::~StallWatch() {
  if (!dir_.empty()) remove_tree(dir_);
}

std::string StallWatch::file(int index) const {
  return dir_.empty() ? std::string() : (fs::path(dir_) / ("rank" + std::to_string(index))).string();
}

std::string StallWatch::last_step_text(int index) const {
  if (dir_.empty()) return "";
  const Beat b = read_beat(file(index));
  return b.step >= 0 ? fmt::format(" (last reported step {})", b.step) : std::string();
}

void StallWatch::reset() {
  for (int i = 0; i < workers_ && !dir_.empty(); ++i) std::ofstream(file(i), std::ios::trunc);
}

std::optional<Stall> StallWatch::check(const std::vector<pid_t>& pids) {
  const auto now = std::chrono::steady_clock::now();
  if (dir_.empty() || now - last_check_ < std::chrono::seconds(1)) return std::nullopt;
  last_check_ = now;
  std::vector<Beat> beats;
  double longest_silence = 0;
  for (int i = 0; i < workers_; ++i) {
    beats.push_back(read_beat(file(i)));
    if (pids[i] > 0 && beats.back().step >= 0) longest_silence = std::max(longest_silence, beats.back().silent_seconds);
  }
  if (longest_silence * 1000 < static_cast<double>(timeout_.count())) return std::nullopt;
  int blamed = -1;
  for (int i = 0; i < workers_; ++i) {
    if (pids[i] <= 0) continue;  // exited: the launcher reports exits itself
    const auto behind = [&](int a, int b) {
      if (beats[a].step != beats[b].step) return beats[a].step < beats[b].step;
      return suspicion(process_state(pids[a])) > suspicion(process_state(pids[b]));
    };
    if (blamed < 0 || behind(i, blamed)) blamed = i;
  }
  if (blamed < 0) return std::nullopt;
  const Beat& b = beats[blamed];
  const std::string where =
      b.step >= 0 ? fmt::format("last reported step {}", b.step) : std::string("it never reported progress");
  return Stall{blamed, fmt::format("made no progress for {:.0f} s ({}; {})", longest_silence, where,
                                   describe_state(process_state(pids[blamed])))};
}

}  // namespace ampp::dist::detail
