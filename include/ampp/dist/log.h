#pragma once
// A small rank-aware logging facade: lines go to stderr prefixed "[ampp rank R] "; by default only
// rank 0 prints info (warnings/errors print on every rank). AMPP_LOG_ALL_RANKS=1 or
// set_log_all_ranks(true) lets every rank print. The rank is taken from init_process_group, or
// from RANK before that.
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace ampp::dist {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void set_log_rank(int rank);
void set_log_all_ranks(bool all);
void set_log_level(LogLevel min_level);  // default kInfo (AMPP_LOG_LEVEL=debug|info|warning|error)
bool log_enabled(LogLevel level);
void log_line(LogLevel level, std::string_view message);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kInfo)) log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warning(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kWarning)) log_line(LogLevel::kWarning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kDebug)) log_line(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ampp::dist
