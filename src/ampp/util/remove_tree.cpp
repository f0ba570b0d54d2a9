// See remove_tree.h.
#include <ampp/util/remove_tree.h>

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

namespace ampp {
namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return std::remove(path) == 0 ? 0 : -1; }

}  // namespace

bool remove_tree(const std::string& path) noexcept {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  // Children before their folder (FTW_DEPTH); links themselves, not their targets (FTW_PHYS). At most
  // 16 folders open at once: nftw closes and reopens deeper ones.
  return ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

}  // namespace ampp
