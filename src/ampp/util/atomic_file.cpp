#include <ampp/util/atomic_file.h>

#include <ampp/util/parse_number.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

namespace ampp {
namespace {

std::string errno_text() { return std::strerror(errno); }

// RAII file descriptor.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  // close() reports deferred write errors (e.g. on network file systems): check it.
  bool close_checked() {
    const int rc = ::close(fd);
    fd = -1;
    return rc == 0;
  }
};

fs::path make_folder(const fs::path& target) {
  const fs::path dir = target.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK(fs::is_directory(dir), "cannot write '", target.string(), "': cannot create folder '", dir.string(),
              "': ", ec ? ec.message() : "a file is in the way");
  return dir;
}

// Persists the directory entry, or a power loss could forget the rename.
void sync_folder(const fs::path& dir) {
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd >= 0) ::fsync(d.fd);
}

[[noreturn]] void fail(const fs::path& tmp, const fs::path& target, const char* step, const std::string& why) {
  std::error_code ignored;
  fs::remove(tmp, ignored);
  TORCH_CHECK(false, "writing '", target.string(), "' failed (", step, "): ", why,
              "; the previous file, if any, is unchanged. Free disk space or choose another folder.");
}

void write_all(int fd, std::string_view bytes, const fs::path& tmp, const fs::path& target) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(tmp, target, "write", n < 0 ? errno_text() : "no progress");
    done += static_cast<size_t>(n);
  }
}

// Temporary files of `target` left by writers that were killed mid-write (their pid is gone).
void remove_leftovers(const fs::path& target) {
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(target.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const auto pid = parse_int(std::string_view(name).substr(prefix.size()));
    if (pid && *pid > 0 && ::kill(static_cast<pid_t>(*pid), 0) != 0 && errno == ESRCH) fs::remove(entry.path(), ec);
  }
}

void rename_over(const fs::path& tmp, const fs::path& target) {
  if (::rename(tmp.c_str(), target.c_str()) != 0) fail(tmp, target, "rename", errno_text());
  sync_folder(target.parent_path());
  remove_leftovers(target);
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, std::vector<std::string_view>{bytes});
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  const fs::path target = fs::absolute(path);
  const fs::path dir = make_folder(target);
  // Same folder, so rename() is atomic (same file system); the pid keeps concurrent writers apart.
  const fs::path tmp = temporary_path_for(target.string());
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(f.fd >= 0, "cannot write '", target.string(), "': cannot create a file in '", dir.string(),
              "': ", errno_text(), "; check that the folder is writable");
  for (const std::string_view bytes : pieces) write_all(f.fd, bytes, tmp, target);
  // The data must be on disk before the rename makes it visible under the real name.
  if (::fsync(f.fd) != 0) fail(tmp, target, "fsync", errno_text());
  if (!f.close_checked()) fail(tmp, target, "close", errno_text());
  rename_over(tmp, target);
}

std::string temporary_path_for(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

void commit_file(const std::string& from, const std::string& to) {
  const fs::path tmp = fs::absolute(from), target = fs::absolute(to);
  Fd f;
  f.fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) fail(tmp, target, "open", errno_text());
  if (::fsync(f.fd) != 0) fail(tmp, target, "fsync", errno_text());
  f.close_checked();
  rename_over(tmp, target);
}

void check_writable_folder(const std::string& folder, const std::string& what) {
  const fs::path dir = fs::absolute(folder);
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK(fs::is_directory(dir), what, " '", folder, "' is not a folder and cannot be created (",
              ec ? ec.message() : "a file is in the way", "); choose another path");
  const fs::path probe = dir / (".ampp-write-test." + std::to_string(::getpid()));
  Fd f;
  f.fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(f.fd >= 0, what, " '", folder, "' is not writable (", errno_text(),
              "); fix its permissions or choose another path");
  f.close_checked();
  fs::remove(probe, ec);
}

}  // namespace ampp
