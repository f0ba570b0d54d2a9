#include <ampp/util/cache_dir.h>

#include <cstdlib>
#include <filesystem>

namespace ampp {

std::string user_cache_dir() {
  namespace fs = std::filesystem;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path base = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  return (base / "ampp").string();
}

}  // namespace ampp
