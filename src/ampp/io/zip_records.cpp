// A bounds-checked reader of torch.save's zip container (zip_records.h). Layouts from PKWARE's
// APPNOTE.TXT: end of central directory (EOCD), its zip64 locator and record, central directory
// headers, local file headers.
#include "zip_records.h"

#include <ampp/util/crc32.h>
#include <ampp/util/little_endian.h>

#include <c10/util/Exception.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace ampp::detail {
namespace zip_format {

constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEnd = 0x06054b50;
constexpr uint32_t kEnd64 = 0x06064b50, kEnd64Locator = 0x07064b50;
constexpr size_t kLocalSize = 30, kCentralSize = 46, kEndSize = 22, kEnd64Size = 56, kLocatorSize = 20;
constexpr size_t kMaxComment = 0xffff;
constexpr uint64_t kMaxEntries = 1 << 20;  // far above any checkpoint; bounds the directory's memory

uint64_t le(const std::string& bytes, size_t at, int width) {
  TORCH_INTERNAL_ASSERT(at + width <= bytes.size());  // callers read fixed-size headers they checked
  return get_le(bytes.data() + at, width);
}

// Where the directory is and how many entries it has (from the EOCD, or its zip64 record).
struct Directory {
  uint64_t offset = 0, size = 0, entries = 0;
};

// The zip64 extended-information extra field (id 1) replaces, in this order, each of the three
// 32-bit values that holds 0xffffffff.
void apply_zip64_extra(const std::string& extra, uint64_t& size, uint64_t& compressed, uint64_t& offset) {
  for (size_t at = 0; at + 4 <= extra.size();) {
    const uint64_t id = le(extra, at, 2), length = le(extra, at + 2, 2);
    if (at + 4 + length > extra.size()) return;
    if (id == 1) {
      size_t field = at + 4;
      for (uint64_t* value : {&size, &compressed, &offset}) {
        if (*value != 0xffffffff) continue;
        if (field + 8 > at + 4 + length) return;
        *value = le(extra, field, 8);
        field += 8;
      }
      return;
    }
    at += 4 + length;
  }
}

}  // namespace zip_format

using namespace zip_format;

ZipRecords::ZipRecords(const std::string& path) : ZipRecords(std::make_unique<std::ifstream>(path, std::ios::binary)) {}

ZipRecords ZipRecords::of_bytes(std::string bytes) {
  return ZipRecords(std::make_unique<std::istringstream>(std::move(bytes), std::ios::binary));
}

ZipRecords::ZipRecords(std::unique_ptr<std::istream> in) : in_(std::move(in)) {
  TORCH_CHECK(*in_, "cannot open the file");
  in_->seekg(0, std::ios::end);
  file_size_ = static_cast<uint64_t>(in_->tellg());
  read_directory();
}

std::vector<std::string> ZipRecords::names() const {
  std::vector<std::string> out;
  for (const auto& entry : entries_) out.push_back(entry.first);
  return out;
}

void ZipRecords::fail(const std::string& what) const { TORCH_CHECK(false, what); }

std::string ZipRecords::bytes_at(uint64_t offset, uint64_t n) {
  if (offset > file_size_ || n > file_size_ - offset)
    fail("a zip structure at byte " + std::to_string(offset) + " runs past the end of the " +
         std::to_string(file_size_) + "-byte file (truncated?)");
  std::string bytes(n, '\0');
  in_->seekg(static_cast<std::streamoff>(offset));
  in_->read(bytes.data(), static_cast<std::streamsize>(n));
  if (!*in_) fail("reading " + std::to_string(n) + " bytes at byte " + std::to_string(offset) + " failed");
  return bytes;
}

void ZipRecords::read_directory() {
  if (file_size_ < kEndSize) fail("it is shorter than a zip's end record");
  const uint64_t tail_size = std::min<uint64_t>(file_size_, kEndSize + kMaxComment);
  const std::string tail = bytes_at(file_size_ - tail_size, tail_size);
  size_t end = std::string::npos;  // the last EOCD signature whose comment reaches the file's end
  for (size_t at = tail.size() - kEndSize + 1; at-- > 0;)
    if (le(tail, at, 4) == kEnd && at + kEndSize + le(tail, at + 20, 2) == tail.size()) {
      end = at;
      break;
    }
  if (end == std::string::npos) fail("no zip end-of-directory record (not a zip file, or truncated)");
  Directory dir{le(tail, end + 16, 4), le(tail, end + 12, 4), le(tail, end + 10, 2)};
  if (dir.offset == 0xffffffff || dir.size == 0xffffffff || dir.entries == 0xffff) {
    const uint64_t end_at = file_size_ - tail_size + end;
    if (end_at < kLocatorSize) fail("a zip64 archive without its zip64 locator");
    const std::string locator = bytes_at(end_at - kLocatorSize, kLocatorSize);
    if (le(locator, 0, 4) != kEnd64Locator) fail("a zip64 archive without its zip64 locator");
    const std::string end64 = bytes_at(le(locator, 8, 8), kEnd64Size);
    if (le(end64, 0, 4) != kEnd64) fail("the zip64 end-of-directory record is missing");
    dir = {le(end64, 48, 8), le(end64, 40, 8), le(end64, 32, 8)};
  }
  if (dir.entries > kMaxEntries) fail("the zip directory declares " + std::to_string(dir.entries) + " entries");
  const std::string central = bytes_at(dir.offset, dir.size);
  size_t at = 0;
  for (uint64_t i = 0; i < dir.entries; ++i) {
    if (at + kCentralSize > central.size() || le(central, at, 4) != kCentralHeader)
      fail("zip directory entry " + std::to_string(i) + " is malformed");
    const uint64_t name_length = le(central, at + 28, 2), extra_length = le(central, at + 30, 2);
    const uint64_t comment_length = le(central, at + 32, 2);
    if (at + kCentralSize + name_length + extra_length + comment_length > central.size())
      fail("zip directory entry " + std::to_string(i) + " runs past the directory");
    const std::string name = central.substr(at + kCentralSize, name_length);
    if (le(central, at + 8, 2) & 1) fail("entry '" + name + "' is encrypted");
    const uint64_t method = le(central, at + 10, 2);
    if (method != 0 && method != 8)
      fail("entry '" + name + "' is compressed with method " + std::to_string(method) +
           " (ampp reads stored and deflated records)");
    uint64_t size = le(central, at + 24, 4), compressed = le(central, at + 20, 4), offset = le(central, at + 42, 4);
    apply_zip64_extra(central.substr(at + kCentralSize + name_length, extra_length), size, compressed, offset);
    if (method == 0 && size != compressed) fail("entry '" + name + "' declares two different sizes");
    if (method == 8 && (size > kMaxInflatedBytes || compressed > kMaxInflatedBytes))
      fail("deflated entry '" + name + "' declares " + std::to_string(size) + " bytes, more than a text record holds");
    add_entry(name, Entry{offset, size, compressed, method == 8, static_cast<uint32_t>(le(central, at + 16, 4))});
    at += kCentralSize + name_length + extra_length + comment_length;
  }
  if (entries_.empty()) fail("the zip archive is empty");
}

void ZipRecords::add_entry(const std::string& full_name, const Entry& entry) {
  const size_t slash = full_name.find('/');
  if (slash == std::string::npos || slash == 0) fail("entry '" + full_name + "' is not inside the archive's folder");
  if (prefix_.empty()) prefix_ = full_name.substr(0, slash + 1);
  if (full_name.compare(0, prefix_.size(), prefix_) != 0)
    fail("entries '" + prefix_ + "...' and '" + full_name + "' are in different top folders");
  if (entry.header_offset > file_size_ || entry.stored > file_size_ - entry.header_offset)
    fail("entry '" + full_name + "' declares " + std::to_string(entry.stored) + " bytes, more than the file holds");
  if (!entries_.emplace(full_name.substr(prefix_.size()), entry).second)
    fail("entry '" + full_name + "' appears twice");
}

uint64_t ZipRecords::data_offset(const std::string& name, const Entry& entry) {
  const std::string local = bytes_at(entry.header_offset, kLocalSize);
  if (le(local, 0, 4) != kLocalHeader) fail("the local header of entry '" + name + "' is missing");
  const uint64_t name_length = le(local, 26, 2), extra_length = le(local, 28, 2);
  if (bytes_at(entry.header_offset + kLocalSize, name_length) != prefix_ + name)
    fail("the local header of entry '" + name + "' names another entry");
  return entry.header_offset + kLocalSize + name_length + extra_length;
}

at::DataPtr ZipRecords::read(const std::string& name, size_t& size) {
  const auto it = entries_.find(name);
  if (it == entries_.end()) fail("it has no record '" + prefix_ + name + "'");
  const Entry& entry = it->second;
  const uint64_t offset = data_offset(name, entry);
  if (offset > file_size_ || entry.stored > file_size_ - offset)
    fail("record '" + name + "' runs past the end of the file (truncated?)");
  at::DataPtr data = c10::GetCPUAllocator()->allocate(entry.size);
  if (entry.deflated) {
    inflate_into(name, bytes_at(offset, entry.stored), static_cast<char*>(data.get()), entry.size);
  } else {
    in_->seekg(static_cast<std::streamoff>(offset));
    in_->read(static_cast<char*>(data.get()), static_cast<std::streamsize>(entry.size));
    if (!*in_) fail("reading record '" + name + "' failed");
  }
  if (crc32_of(static_cast<const char*>(data.get()), entry.size) != entry.crc32)
    fail("record '" + name + "' is corrupted (its CRC-32 does not match the zip directory)");
  size = entry.size;
  return data;
}

// Raw deflate (zip method 8) into exactly `size` bytes: the stream must end there, having used all its input.
void ZipRecords::inflate_into(const std::string& name, const std::string& deflated, char* out, uint64_t size) {
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) fail("zlib cannot start inflating record '" + name + "'");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(deflated.data()));
  z.avail_in = static_cast<uInt>(deflated.size());
  z.next_out = reinterpret_cast<Bytef*>(out);
  z.avail_out = static_cast<uInt>(size);
  const int status = inflate(&z, Z_FINISH);
  const bool whole = status == Z_STREAM_END && z.avail_in == 0 && z.total_out == size;
  inflateEnd(&z);
  if (!whole)
    fail("deflated record '" + name + "' does not inflate to the " + std::to_string(size) + " bytes it declares");
}

std::string ZipRecords::read_string(const std::string& name) {
  size_t size = 0;
  const at::DataPtr data = read(name, size);
  return std::string(static_cast<const char*>(data.get()), size);
}

}  // namespace ampp::detail
