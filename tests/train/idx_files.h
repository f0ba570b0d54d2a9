#pragma once
// MNIST-format IDX files written by tests: the dataset tests' hand-checked folders and the CLI's.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ampp_test {

// An IDX file: 0,0,0x08,ndim, big-endian dims, then bytes.
inline std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  s.append(data.begin(), data.end());
  return s;
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(p.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(p, std::ios::binary) << bytes;
  }
}

inline std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7);
  return v;
}

// An MNIST-format folder of `train` and `test` images of rows x cols pixels, labels cycling over `classes`.
inline void write_mnist_folder(const std::filesystem::path& dir, uint32_t train, uint32_t test, uint32_t rows,
                               uint32_t cols, bool gzip, uint32_t classes = 3) {
  const std::string gz = gzip ? ".gz" : "";
  auto labels = [classes](uint32_t n) {
    std::vector<uint8_t> v(n);
    for (uint32_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i % classes);
    return v;
  };
  write_file(dir / ("train-images-idx3-ubyte" + gz), idx_bytes({train, rows, cols}, iota_bytes(train * rows * cols)),
             gzip);
  write_file(dir / ("train-labels-idx1-ubyte" + gz), idx_bytes({train}, labels(train)), gzip);
  write_file(dir / ("t10k-images-idx3-ubyte" + gz), idx_bytes({test, rows, cols}, iota_bytes(test * rows * cols)),
             gzip);
  write_file(dir / ("t10k-labels-idx1-ubyte" + gz), idx_bytes({test}, labels(test)), gzip);
}

}  // namespace ampp_test
