#pragma once
// Subcommands of `ampp` register themselves here from their own translation unit, so that
// `train`, `run` and `bench` stay independent files. Safe because they are linked into the
// executable directly (static initialisers in an executable's own objects always run).
#include <ampp/util/parse_number.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace ampp::cli {

struct Command {
  std::string name;
  std::string description;
  // Adds the subcommand's options to `sub`; returns the function that runs it (exit code).
  std::function<std::function<int()>(CLI::App& sub)> setup;
  // Option fields whose flag is not "--" + the field name with '-' for '_' (see flag_names).
  std::map<std::string, std::string> renamed_fields = {};
};

// The library names its option fields in errors ("LaunchOptions::nproc_per_node must be >= 1"); a
// user of the command line typed flags. Rewrites every "<Something>Options::<field>" in `message`
// as the flag that sets it ("--nproc-per-node"), using `renamed` where the two names differ.
std::string flag_names(const std::string& message, const std::map<std::string, std::string>& renamed);

std::vector<Command>& commands();

// The command line as the user typed it, after the program name ("train", "--nproc", "2", ...):
// a command that re-executes itself (`ampp train` starting its workers) passes it on unchanged.
const std::vector<std::string>& original_args();

inline bool register_command(Command command) {
  commands().push_back(std::move(command));
  return true;
}

// A CLI11 validator made of one of the library's parsers: its message, after CLI11's "--flag: ".
template <typename Parse>
CLI::Validator parsed_by(Parse parse, const std::string& name) {
  return CLI::Validator(
      [parse](std::string& text) -> std::string {
        try {
          parse(text);
          return {};
        } catch (const c10::Error& e) {
          return e.what_without_backtrace();
        }
      },
      "", name);
}

// `text` as a T by ampp's one whole-string parser; nullopt when it is not one or does not fit.
template <typename T>
std::optional<T> parse_as(const std::string& text) {
  if constexpr (std::is_integral_v<T>) {
    const auto v = ampp::parse_int(text);
    if (!v) return std::nullopt;
    if constexpr (std::is_unsigned_v<T>) {
      if (*v < 0 || static_cast<uint64_t>(*v) > std::numeric_limits<T>::max()) return std::nullopt;
    } else {
      if (*v < std::numeric_limits<T>::min() || *v > std::numeric_limits<T>::max()) return std::nullopt;
    }
    return static_cast<T>(*v);
  } else {
    return ampp::parse_real(text);
  }
}

// A CLI11 validator that accepts what parse_as<T> reads.
template <typename T>
CLI::Validator number_check() {
  std::string kind = "a finite number";
  if constexpr (std::is_integral_v<T>) {
    // parse_int reads int64, so an unsigned field's largest value is int64's.
    const auto largest = std::min<uint64_t>(std::numeric_limits<T>::max(), std::numeric_limits<int64_t>::max());
    kind = fmt::format("an integer in {}..{}", std::numeric_limits<T>::min(), largest);
  }
  return CLI::Validator(
      [kind](std::string& text) -> std::string {
        return parse_as<T>(text) ? std::string() : "'" + text + "' is not " + kind;
      },
      "", std::is_integral_v<T> ? "INT" : "NUMBER");
}

// A number flag bound to `field`, parsed by parse_as<T>: not CLI11's own conversion, which turns
// 99999999999999999999 into INT64_MAX without a word. The field's value is the shown default.
template <typename T>
CLI::Option* add_number(CLI::App& sub, const std::string& name, T& field, const std::string& help) {
  return sub
      .add_option_function<std::string>(
          name, [&field](const std::string& text) { field = *parse_as<T>(text); }, help)
      ->check(number_check<T>())
      ->type_name(std::is_integral_v<T> ? "INT" : "NUMBER")
      ->default_str(fmt::format("{}", field));
}

// The same for a field whose default depends on other options (unset until the flag is given);
// `shown_default` says what it is.
template <typename T>
CLI::Option* add_number(CLI::App& sub, const std::string& name, std::optional<T>& field, const std::string& help,
                        const std::string& shown_default) {
  return sub
      .add_option_function<std::string>(
          name, [&field](const std::string& text) { field = *parse_as<T>(text); }, help)
      ->check(number_check<T>())
      ->type_name(std::is_integral_v<T> ? "INT" : "NUMBER")
      ->default_str(shown_default);
}

}  // namespace ampp::cli
