#pragma once
// ampp's own log calls with fmt format strings (internal: the public log.h takes finished lines, so
// that a program using ampp needs no fmt). Formatting happens only when the level is enabled.
#include <ampp/dist/log.h>

#include <fmt/format.h>

#include <utility>

namespace ampp::dist {

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
