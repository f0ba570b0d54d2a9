// `ampp`: train, run (torchrun-compatible launcher) and bench.
#include "command_registry.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <iostream>
#include <map>
#include <regex>

namespace ampp::cli {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

std::vector<std::string>& original_args_storage() {
  static std::vector<std::string> args;
  return args;
}

const std::vector<std::string>& original_args() { return original_args_storage(); }

std::string flag_names(const std::string& message, const std::map<std::string, std::string>& renamed) {
  static const std::regex field(R"(\b[A-Z][A-Za-z]*Options::([a-z0-9_]+))");
  std::string out;
  auto last = message.cbegin();
  for (std::sregex_iterator it(message.begin(), message.end(), field), end; it != end; ++it) {
    out.append(last, (*it)[0].first);
    std::string name = (*it)[1].str();
    if (auto r = renamed.find(name); r != renamed.end()) {
      out += r->second;
    } else {
      std::replace(name.begin(), name.end(), '_', '-');
      out += "--" + name;
    }
    last = (*it)[0].second;
  }
  return out.append(last, message.cend());
}
}  // namespace ampp::cli

int main(int argc, char** argv) {
  ampp::cli::original_args_storage().assign(argv + 1, argv + argc);
  CLI::App app{"ampp: automatic mixed precision and data-parallel training for LibTorch"};
  app.require_subcommand(1);
  auto& commands = ampp::cli::commands();
  std::sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
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
  for (auto& command : commands) {
    CLI::App* sub = app.get_subcommand(command.name);
    if (!sub->parsed()) continue;
    auto fail = [&](const std::string& message) {
      std::cerr << "ampp " << command.name << ": error: " << ampp::cli::flag_names(message, command.renamed_fields)
                << "\n";
      return 1;
    };
    try {
      return runners.at(sub)();
    } catch (const c10::Error& e) {
      return fail(e.what_without_backtrace());  // LibTorch's what() carries a C++ backtrace
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  return 2;
}
