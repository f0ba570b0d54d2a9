#pragma once
// Subcommands of `ampp` register themselves here from their own translation unit, so that
// `train`, `run` and `bench` stay independent files. Safe because they are linked into the
// executable directly (static initialisers in an executable's own objects always run).
#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <string>
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

}  // namespace ampp::cli
