#include <ampp/util/folder_lock.h>

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace ampp {
namespace {

std::string read_small(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("unknown");
}

}  // namespace

FolderLock::FolderLock(const std::string& folder, const std::string& what) {
  const std::string path = (std::filesystem::path(folder) / ".ampp.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TORCH_CHECK(fd_ >= 0, what, " '", folder, "': cannot create the lock file '", path, "': ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string holder = read_small(fd_);
    ::close(fd_);
    fd_ = -1;
    TORCH_CHECK(false, what, " '", folder, "' is in use by another run (pid ", holder,
                "); wait for it to finish or choose another folder");
  }
  // The holder's pid, for the message above (informative only: the lock itself is the flock).
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // Not fatal: the lock holds without the pid.
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace ampp
