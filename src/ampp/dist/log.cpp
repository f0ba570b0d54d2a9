#include <ampp/dist/log.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace ampp::dist {
namespace {

int env_rank() {
  const char* r = std::getenv("RANK");
  return r ? std::atoi(r) : 0;
}
bool env_all_ranks() {
  const char* v = std::getenv("AMPP_LOG_ALL_RANKS");
  return v && std::strcmp(v, "0") != 0 && *v;
}
LogLevel env_level() {
  const char* v = std::getenv("AMPP_LOG_LEVEL");
  if (!v) return LogLevel::kInfo;
  const std::string s(v);
  if (s == "debug") return LogLevel::kDebug;
  if (s == "warning") return LogLevel::kWarning;
  if (s == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int> g_rank{env_rank()};
std::atomic<bool> g_all{env_all_ranks()};
std::atomic<int> g_level{static_cast<int>(env_level())};

}  // namespace

void set_log_rank(int rank) { g_rank = rank; }
void set_log_all_ranks(bool all) { g_all = all; }
void set_log_level(LogLevel min_level) { g_level = static_cast<int>(min_level); }

bool log_enabled(LogLevel level) {
  if (static_cast<int>(level) < g_level.load()) return false;
  // Warnings and errors matter on every rank; chatter only from rank 0 unless asked.
  return level >= LogLevel::kWarning || g_all.load() || g_rank.load() == 0;
}

void log_line(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  static std::mutex mu;
  static const char* names[] = {"debug", "info", "warning", "error"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[ampp rank %d %s] %.*s\n", g_rank.load(), names[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace ampp::dist
