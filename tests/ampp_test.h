#pragma once
// What every test suite shares, in one namespace (ampp_test): a temporary folder, a snapshot of
// tensors, bit-exact comparison, one way to assert an error message, and a free port.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

// Suites that start programs without loading LibTorch (tests/launcher's ampp_run_tests) define
// AMPP_TEST_NO_TORCH and get the parts that need no tensors. Not __has_include: that would find
// Debian's /usr/include/ATen in a build against another LibTorch.
#ifndef AMPP_TEST_NO_TORCH
#include <ATen/ATen.h>
#include <ampp/util/remove_tree.h>
#define AMPP_TEST_HAS_TORCH 1
#endif

// AMPP_TEST_UNDER_ASAN: this file is compiled with AddressSanitizer (gcc defines __SANITIZE_ADDRESS__,
// clang answers __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define AMPP_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AMPP_TEST_UNDER_ASAN 1
#endif
#endif

// Expects `stmt` to throw a std::exception (c10::Error included) whose message contains `text`.
// c10::Error is matched on its message without LibTorch's backtrace.
#define AMPP_EXPECT_THROW_WITH(stmt, text)                                                       \
  do {                                                                                           \
    const std::string ampp_message_ = ::ampp_test::error_of([&] { stmt; });                      \
    EXPECT_THAT(ampp_message_, ::testing::HasSubstr(text)) << "expected an error containing it"; \
  } while (0)

namespace ampp_test {

// A port the kernel just handed out on 127.0.0.1 (closed again; tiny race, fine for tests).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The message of the error `fn` throws, or "<no error>": for several checks on one error, or to
// check that a call does not throw. A single expectation reads better as AMPP_EXPECT_THROW_WITH.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
#ifdef AMPP_TEST_HAS_TORCH
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
#endif
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

// The bytes of a file ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh folder under $TMPDIR (mkdtemp), removed with everything in it at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ampp-test-") {
    std::string templ = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
    path_ = templ;
  }
  ~TempDir() {
#ifdef AMPP_TEST_NO_TORCH
    std::error_code ignored;  // no LibTorch in this program: nothing can interpose std::filesystem
    std::filesystem::remove_all(path_, ignored);
#else
    ampp::remove_tree(path_.string());  // see remove_tree.h: why not std::filesystem::remove_all
#endif
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

#ifdef AMPP_TEST_HAS_TORCH
// Detached copies: what the tensors hold now, unaffected by later in-place updates.
inline std::vector<at::Tensor> snapshot(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> copies;
  copies.reserve(tensors.size());
  for (const auto& t : tensors) copies.push_back(t.defined() ? t.detach().clone() : at::Tensor());
  return copies;
}

// Same dtype, shape and bits (NaNs with equal payloads compare equal, unlike equal()).
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

inline bool same_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i])) return false;
  return true;
}
#endif  // AMPP_TEST_HAS_TORCH

}  // namespace ampp_test
