#pragma once
// Subcommands of `ampp` register themselves here from their own translation unit, so that
// `train`, `run` and `bench` stay independent files. Safe because they are linked into the
// executable directly (static initialisers in an executable's own objects always run).
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace ampp::cli {

struct Command {
  std::string name;
  std::string description;
  // Adds the subcommand's options to `sub`; returns the function that runs it (exit code).
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

std::vector<Command>& commands();

inline bool register_command(Command command) {
  commands().push_back(std::move(command));
  return true;
}

}  // namespace ampp::cli
