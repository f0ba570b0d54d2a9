#include <ampp/util/crc32.h>

#include <zlib.h>

#include <algorithm>

namespace ampp {

uint32_t crc32_of(const void* data, size_t n) {
  const auto* bytes = static_cast<const Bytef*>(data);
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t done = 0; done < n;) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(n - done, 1u << 30));
    crc = crc32(crc, bytes + done, chunk);
    done += chunk;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace ampp
