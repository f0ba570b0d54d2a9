#pragma once
// The records of a torch.save zip archive, read from an untrusted file: ampp's own reader of the zip
// directory instead of LibTorch's PyTorchStreamReader, because that one (miniz built without its CRC
// checks) neither checks the CRC-32 of what it reads nor bounds the sizes a file declares.
//
// Every offset and size in the file is checked against the file's length before it is used; records
// must be stored (uncompressed, as torch.save writes tensors) or deflated (as LibTorch's archive writer
// stores its code/ text), the inflated size bounded by kMaxInflatedBytes; each record read is checked against the
// CRC-32 its directory entry declares. Zip64 (archives over 4 GiB) is read. Errors are one line saying
// what is wrong (the caller names the file).
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ampp::detail {

/// Deflated records are text (an archive's code/): far below this, which bounds a zip bomb's output.
constexpr uint64_t kMaxInflatedBytes = uint64_t{64} << 20;

class ZipRecords {
 public:
  /// Reads and checks the central directory of `path`. All entries share one top folder (torch.save
  /// names it after the file), which record names below leave out: "data.pkl", "data/0", "version".
  explicit ZipRecords(const std::string& path);
  /// The same over bytes in memory (a zip inside another container: checkpoint.ampp's payload).
  static ZipRecords of_bytes(std::string bytes);

  /// Every record's name, as contains() takes it.
  std::vector<std::string> names() const;

  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  /// The record's bytes in a fresh CPU allocation of exactly its size, CRC-checked; `size` receives it.
  at::DataPtr read(const std::string& name, size_t& size);
  std::string read_string(const std::string& name);

 private:
  struct Entry {
    uint64_t header_offset = 0;  // of the local file header
    uint64_t size = 0;           // as read
    uint64_t stored = 0;         // in the file: size, or the deflated size
    bool deflated = false;
    uint32_t crc32 = 0;
  };
  void read_directory();
  void add_entry(const std::string& full_name, const Entry& entry);
  uint64_t data_offset(const std::string& name, const Entry& entry);
  std::string bytes_at(uint64_t offset, uint64_t n);
  void inflate_into(const std::string& name, const std::string& deflated, char* out, uint64_t size);
  [[noreturn]] void fail(const std::string& what) const;

  explicit ZipRecords(std::unique_ptr<std::istream> in);

  std::unique_ptr<std::istream> in_;
  uint64_t file_size_ = 0;
  std::string prefix_;  // "archive/"
  std::map<std::string, Entry> entries_;
};

}  // namespace ampp::detail
