// archive_classes() (archive_classes.h): a line scan of the exporter's class declarations.
#include "archive_classes.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace ampp::detail {
namespace {

// A declaration file is a few lines per attribute; a large one is not the exporter's.
constexpr size_t kMaxDeclarationBytes = 1 << 20;

// "code/__torch__.py" -> "__torch__"; "code/__torch__/___torch_mangle_3.py" -> "__torch__.___torch_mangle_3".
std::string module_of(const std::string& record) {
  std::string module = record.substr(5, record.size() - 5 - 3);
  for (char& c : module)
    if (c == '/') c = '.';
  return module;
}

// The names in `  __parameters__ = ["weight", "bias", ]`.
std::set<std::string> quoted_names(const std::string& line) {
  std::set<std::string> names;
  for (size_t open = line.find('"'); open != std::string::npos;) {
    const size_t close = line.find('"', open + 1);
    TORCH_CHECK(close != std::string::npos, "an unterminated name in the declaration '", line.substr(0, 80), "'");
    names.insert(line.substr(open + 1, close - open - 1));
    open = line.find('"', close + 1);
  }
  return names;
}

bool starts_with(const std::string& text, size_t at, const std::string& prefix) {
  return at != std::string::npos && text.compare(at, prefix.size(), prefix) == 0;
}

void declare(const std::string& module, const std::string& code, ArchiveClasses& out) {
  std::istringstream lines(code);
  std::string line;
  ArchiveClass* current = nullptr;
  while (std::getline(lines, line)) {
    if (starts_with(line, 0, "class ")) {
      const size_t paren = line.find('(');
      TORCH_CHECK(paren != std::string::npos && paren > 6, "a malformed class line in code/: '", line.substr(0, 80),
                  "'");
      const std::string name = module + "." + line.substr(6, paren - 6);
      const auto [it, added] = out.emplace(name, ArchiveClass{});
      TORCH_CHECK(added, "class ", name, " is declared twice in code/");
      current = &it->second;
      continue;
    }
    const size_t text = line.find_first_not_of(' ');
    if (current && starts_with(line, text, "__parameters__ = ")) current->parameters = quoted_names(line);
    if (current && starts_with(line, text, "__buffers__ = ")) current->buffers = quoted_names(line);
  }
}

}  // namespace

ArchiveClasses archive_classes(ZipRecords& zip) {
  ArchiveClasses classes;
  for (const std::string& record : zip.names()) {
    const bool source =
        record.size() > 8 && record.compare(0, 5, "code/") == 0 && record.compare(record.size() - 3, 3, ".py") == 0;
    if (!source) continue;
    const std::string code = zip.read_string(record);
    TORCH_CHECK(code.size() <= kMaxDeclarationBytes, "record '", record, "' holds ", code.size(),
                " bytes, more than an archive's class declarations");
    declare(module_of(record), code, classes);
  }
  TORCH_CHECK(!classes.empty(), "it declares no module class (no code/ record): not a torch::serialize archive");
  return classes;
}

}  // namespace ampp::detail
