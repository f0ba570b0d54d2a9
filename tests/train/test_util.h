#pragma once
// Helpers shared by the train tests.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>

// Expects `stmt` to throw a std::exception whose message contains `needle`.
#define EXPECT_THROW_MSG(stmt, needle)                                                  \
  do {                                                                                  \
    try {                                                                               \
      stmt;                                                                             \
      ADD_FAILURE() << "expected an exception containing '" << (needle) << "'";        \
    } catch (const std::exception& e) {                                                 \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();     \
    }                                                                                   \
  } while (0)

// A fresh temporary folder, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("ampp-train-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};
