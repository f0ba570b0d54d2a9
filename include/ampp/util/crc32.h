#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// The CRC-32 of zip and gzip (zlib's), which ampp's checkpoint container, torch.save's zip records and
// the dataset cache use to tell intact bytes from damaged ones.
#include <cstddef>
#include <cstdint>

namespace ampp {

/// zlib's crc32 of `n` bytes at `data`, of any length (zlib takes 32-bit lengths: longer runs go in pieces).
uint32_t crc32_of(const void* data, size_t n);

}  // namespace ampp
