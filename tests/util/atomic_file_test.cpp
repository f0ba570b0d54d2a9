// Output files are all-or-nothing, unusable folders are named before any work, one run per folder.
#include <ampp/util/atomic_file.h>
#include <ampp/util/folder_lock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampp_test.h"

namespace fs = std::filesystem;

namespace {

int files_in(const fs::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++n;
  return n;
}

// Runs write_file_atomic in a child whose file size limit is `limit` bytes (RLIMIT_FSIZE: writes past it
// fail with EFBIG, as writes to a full disk fail with ENOSPC). The child exits 0 when it got an
// error containing `expected`.
int write_with_size_limit(const fs::path& path, const std::string& bytes, rlim_t limit, const std::string& expected) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // else the kernel kills the writer instead of failing the write
    rlimit rl{limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    const std::string error = ampp_test::error_of([&] { ampp::write_file_atomic(path.string(), bytes); });
    ::_exit(error.find(expected) != std::string::npos ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST(AtomicFile, WritesReplacesAndCreatesTheFolder) {
  ampp_test::TempDir tmp;
  const fs::path file = tmp.path() / "a" / "b" / "model.pt";
  ampp::write_file_atomic(file.string(), "first");
  EXPECT_EQ(ampp_test::read_file(file), "first");
  ampp::write_file_atomic(file.string(), std::string(100000, 'x'));
  EXPECT_EQ(ampp_test::read_file(file), std::string(100000, 'x'));
  EXPECT_EQ(files_in(file.parent_path()), 1) << "no temporary file left behind";
}

TEST(AtomicFile, AFullDiskLeavesThePreviousFileAndNoTemporary) {
  ampp_test::TempDir tmp;
  const fs::path file = tmp.path() / "model.pt";
  ampp::write_file_atomic(file.string(), "the previous model");
  const std::string expected = "writing '" + file.string() + "' failed (write): File too large; the previous file";
  EXPECT_EQ(write_with_size_limit(file, std::string(64 * 1024, 'y'), 4096, expected), 0) << expected;
  EXPECT_EQ(ampp_test::read_file(file), "the previous model");
  EXPECT_EQ(files_in(tmp.path()), 1) << "the partial temporary file was removed";
}

TEST(AtomicFile, CommitFileMovesAFinishedFileOverTheTarget) {
  ampp_test::TempDir tmp;
  std::ofstream(tmp.path() / "plot.png.tmp") << "png";
  ampp::commit_file((tmp.path() / "plot.png.tmp").string(), (tmp.path() / "plot.png").string());
  EXPECT_EQ(ampp_test::read_file(tmp.path() / "plot.png"), "png");
  EXPECT_FALSE(fs::exists(tmp.path() / "plot.png.tmp"));
  AMPP_EXPECT_THROW_WITH(ampp::commit_file((tmp.path() / "gone").string(), (tmp.path() / "x").string()),
                         "failed (open): No such file or directory");
}

TEST(AtomicFile, UnusableFoldersAreNamedWithTheCause) {
  ampp_test::TempDir tmp;
  std::ofstream(tmp.path() / "a-file") << "x";
  AMPP_EXPECT_THROW_WITH(ampp::check_writable_folder((tmp.path() / "a-file").string(), "TrainOptions::out"),
                         "TrainOptions::out '" + (tmp.path() / "a-file").string() + "' is not a folder");
  AMPP_EXPECT_THROW_WITH(ampp::check_writable_folder((tmp.path() / "a-file" / "sub").string(), "X::dir"),
                         "is not a folder and cannot be created");
  // /proc/self is a folder no one (root included) can create files in.
  AMPP_EXPECT_THROW_WITH(ampp::check_writable_folder("/proc/self", "TrainOptions::checkpoint_dir"),
                         "TrainOptions::checkpoint_dir '/proc/self' is not writable");
  ampp::check_writable_folder((tmp.path() / "new" / "folder").string(), "TrainOptions::out");
  EXPECT_TRUE(fs::is_directory(tmp.path() / "new" / "folder"));
  EXPECT_EQ(files_in(tmp.path() / "new" / "folder"), 0) << "the probe file is removed";
}

TEST(FolderLock, ASecondHolderIsRefusedWithTheFirstHoldersPid) {
  ampp_test::TempDir tmp;
  {
    ampp::FolderLock first(tmp.path().string(), "TrainOptions::out");
    AMPP_EXPECT_THROW_WITH(ampp::FolderLock(tmp.path().string(), "TrainOptions::out"),
                           "' is in use by another run (pid " + std::to_string(::getpid()) + ")");
  }
  ampp::FolderLock again(tmp.path().string(), "TrainOptions::out");  // released with its holder
}
