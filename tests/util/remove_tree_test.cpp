// ampp::remove_tree: a folder with files, subfolders and a link goes, the link's target stays, and a
// missing path is no error.
#include <ampp/util/remove_tree.h>

#include <filesystem>
#include <fstream>

#include "ampp_test.h"

namespace fs = std::filesystem;

TEST(RemoveTree, RemovesAFolderWithEverythingBelowItButNotWhatLinksPointTo) {
  ampp_test::TempDir tmp;
  const fs::path keep = tmp.path() / "keep.txt", tree = tmp.path() / "tree";
  std::ofstream(keep) << "stays";
  fs::create_directories(tree / "a" / "b" / "c");
  std::ofstream(tree / "top.txt") << "x";
  std::ofstream(tree / "a" / "b" / "c" / "deep.txt") << "y";
  fs::create_symlink(keep, tree / "a" / "link");
  fs::create_directory_symlink(tmp.path(), tree / "a" / "dir_link");  // a loop, were links followed
  EXPECT_TRUE(ampp::remove_tree(tree.string()));
  EXPECT_FALSE(fs::exists(fs::symlink_status(tree)));
  EXPECT_TRUE(fs::exists(keep)) << "a link's target was removed";
}

TEST(RemoveTree, AMissingPathIsNoErrorAndAFileIsRemoved) {
  ampp_test::TempDir tmp;
  EXPECT_TRUE(ampp::remove_tree((tmp.path() / "never-made").string()));
  const fs::path file = tmp.path() / "file";
  std::ofstream(file) << "z";
  EXPECT_TRUE(ampp::remove_tree(file.string()));
  EXPECT_FALSE(fs::exists(file));
}

TEST(RemoveTree, ReportsAPathItCannotReach) {
  ampp_test::TempDir tmp;
  const fs::path file = tmp.path() / "file";
  std::ofstream(file) << "z";
  EXPECT_FALSE(ampp::remove_tree((file / "below-a-file").string()));  // ENOTDIR, not "missing"
  EXPECT_TRUE(fs::exists(file));
}
