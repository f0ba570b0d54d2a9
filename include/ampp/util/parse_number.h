#pragma once
// Whole-string number parsing, the one parser every option, flag and environment variable uses.
// "12abc", " 12", "", "1e999" and (for the real parser) "nan"/"inf" are all rejected: callers turn the
// empty result into an error that names their own field and the fix.
#include <cstdint>
#include <optional>
#include <string_view>

namespace ampp {

/// A decimal integer that fills the whole text and fits int64 ("-3", "128"); otherwise nullopt.
std::optional<int64_t> parse_int(std::string_view text);

/// A finite real number that fills the whole text ("0.05", "1e-4", "65536"); otherwise nullopt.
std::optional<double> parse_real(std::string_view text);

}  // namespace ampp
