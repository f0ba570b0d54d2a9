#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// One writer per output folder: two runs writing into the same folder would silently interleave
// or overwrite each other's files.
#include <string>

namespace ampp {

/// Holds an exclusive lock (flock) on `<folder>/.ampp.lock` for its lifetime; the kernel releases it
/// when the process ends, however it ends. Throws a one-line c10::Error starting with `what`
/// (e.g. "TrainOptions::out") naming the holder's pid when another process holds it.
class FolderLock {
 public:
  FolderLock(const std::string& folder, const std::string& what);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace ampp
