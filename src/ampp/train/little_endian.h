#pragma once
// Little-endian integers in byte strings: the checkpoint container's header (checkpoint.cpp) and
// TensorBoard's record framing (tensorboard.cpp) are both written this way, whatever the host's order.
#include <cstdint>
#include <string>

namespace ampp::train::detail {

/// Appends the low `bytes` bytes of `value`, least significant first.
inline void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

/// Reads `bytes` bytes at `p`, least significant first.
inline uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace ampp::train::detail
