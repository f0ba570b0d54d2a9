// `ampp`: train, run (torchrun-compatible launcher) and bench.
#include "command_registry.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <iostream>
#include <map>

namespace ampp::cli {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}
}  // namespace ampp::cli

int main(int argc, char** argv) {
  CLI::App app{"ampp: automatic mixed precision and data-parallel training for LibTorch"};
  app.require_subcommand(1);
  auto& commands = ampp::cli::commands();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> runners;
  for (auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    runners[sub] = command.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const c10::Error& e) {
        // LibTorch's what() carries a C++ backtrace; users need the message.
        std::cerr << "ampp " << sub->get_name() << ": error: " << e.what_without_backtrace() << "\n";
        return 1;
      } catch (const std::exception& e) {
        std::cerr << "ampp " << sub->get_name() << ": error: " << e.what() << "\n";
        return 1;
      }
    }
  }
  return 2;
}
