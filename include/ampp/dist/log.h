#pragma once
// A small rank-aware logging facade: lines go to stderr prefixed "[ampp rank R] "; by default only
// rank 0 prints info (warnings/errors print on every rank). AMPP_LOG_ALL_RANKS=1 or
// set_log_all_ranks(true) lets every rank print. The rank is taken from init_process_group, or
// from RANK before that.
#include <string_view>

namespace ampp::dist {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void set_log_rank(int rank);
void set_log_all_ranks(bool all);
void set_log_level(LogLevel min_level);  // default kInfo (AMPP_LOG_LEVEL=debug|info|warning|error)
bool log_enabled(LogLevel level);
/// Prints `message` as one line at `level`, when log_enabled(level).
void log_line(LogLevel level, std::string_view message);

}  // namespace ampp::dist
