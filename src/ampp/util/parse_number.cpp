#include <ampp/util/parse_number.h>

#include <charconv>
#include <cmath>
#include <system_error>

namespace ampp {

namespace {
// std::from_chars: no locale, no leading whitespace, reports out-of-range instead of saturating.
template <typename T>
std::optional<T> parse_whole(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);  // "+3" as strtol and Python accept
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}
}  // namespace

std::optional<int64_t> parse_int(std::string_view text) { return parse_whole<int64_t>(text); }

std::optional<double> parse_real(std::string_view text) {
  const auto value = parse_whole<double>(text);
  if (!value || !std::isfinite(*value)) return std::nullopt;
  return value;
}

}  // namespace ampp
