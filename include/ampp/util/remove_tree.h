#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Removing a folder and everything in it, without std::filesystem::remove_all.
//
// Some LibTorch wheels (torch 2.11.0+cu130 seen, on a GPU machine whose g++ links libstdc++
// statically) export their own copies of std::filesystem. A program's calls then bind to those, and
// remove_all there jumped to address 0 (docs/gpu.md). glibc's nftw cannot be interposed that way.
#include <string>

namespace ampp {

/// Removes `path` and, when it is a folder, everything below it; symbolic links are removed, never
/// followed. A missing `path` is no error. Returns false, leaving what it could not remove, on the
/// first failure (see errno).
bool remove_tree(const std::string& path) noexcept;

}  // namespace ampp
