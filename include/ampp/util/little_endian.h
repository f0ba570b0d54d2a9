#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Little-endian integers in byte strings, whatever the host's order: the checkpoint container's header,
// TensorBoard's record framing and the zip records of torch.save files are all written this way.
#include <cstdint>
#include <string>

namespace ampp {

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

}  // namespace ampp
