#include <ampp/train/idx_file.h>
#include <ampp/util/atomic_file.h>
#include <ampp/util/crc32.h>
#include <c10/util/accumulate.h>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

namespace fs = std::filesystem;

namespace ampp::train {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// Reads exactly n bytes or throws; gzread also reads uncompressed files transparently.
void read_exact(gzFile file, const std::string& path, void* out, size_t n, const char* what) {
  auto* dst = static_cast<unsigned char*>(out);
  size_t done = 0;
  while (done < n) {
    // gzread takes an unsigned int count: read in chunks below 1 GiB.
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    const int got = gzread(file, dst + done, chunk);
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(file, &err);
      TORCH_CHECK(false, "IDX file '", path, "' is corrupt (zlib: ", msg, ") while reading the ", what,
                  "; re-download or reinstall the dataset");
    }
    TORCH_CHECK(got > 0, "IDX file '", path, "' is truncated: expected ", n, " bytes of ", what, ", got ", done,
                "; re-download or reinstall the dataset");
    done += static_cast<size_t>(got);
  }
}

// The number of dimensions the 4 magic bytes declare, after checking they are an unsigned-byte IDX's.
int idx_dimensions(const unsigned char* magic, const std::string& path) {
  TORCH_CHECK(magic[0] == 0 && magic[1] == 0, "'", path,
              "' is not an IDX file (bad magic number); expected an MNIST-format file such as train-images-idx3-ubyte");
  TORCH_CHECK(magic[2] == 0x08, "IDX file '", path, "' has element type 0x", fmt::format("{:02x}", magic[2]),
              "; only unsigned-byte (0x08) IDX files are supported, as in MNIST-format datasets");
  const int ndim = magic[3];
  TORCH_CHECK(ndim >= 1 && ndim <= 4, "IDX file '", path, "' declares ", ndim, " dimensions; expected 1 to 4");
  return ndim;
}

// The shape held as `ndim` big-endian 32-bit sizes.
std::vector<int64_t> idx_shape(const unsigned char* sizes, int ndim, const std::string& path) {
  std::vector<int64_t> shape(static_cast<size_t>(ndim));
  constexpr int64_t kMaxElements = int64_t{1} << 34;
  int64_t numel = 1;
  for (int i = 0; i < ndim; ++i) {
    const unsigned char* b = sizes + 4 * i;
    shape[i] = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    // Checked before multiplying: two 32-bit sizes already overflow what the product may reach.
    TORCH_CHECK(shape[i] == 0 || numel <= kMaxElements / shape[i], "IDX file '", path,
                "' declares an implausibly large array; it is corrupt");
    numel *= shape[i];
  }
  return shape;
}

std::string idx_header(c10::IntArrayRef shape) {
  std::string s{'\0', '\0', '\x08', static_cast<char>(shape.size())};
  for (const int64_t d : shape) {
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  return s;
}

uint32_t crc32_of(const torch::Tensor& array) {
  return ampp::crc32_of(array.data_ptr<uint8_t>(), static_cast<size_t>(array.numel()));
}

std::shared_ptr<unsigned char> map_whole_file(const std::string& path, size_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot open IDX file '", path, "' for reading: ", std::strerror(errno));
  struct stat st{};
  const bool sized = ::fstat(fd, &st) == 0;
  size = sized ? static_cast<size_t>(st.st_size) : 0;
  // Private and writable: pages stay the page cache's (shared) until this process writes one.
  void* base = size >= 4 ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  const int map_errno = errno;
  ::close(fd);
  TORCH_CHECK(size >= 4, "IDX file '", path, "' is truncated: ", size, " bytes, not even a header");
  TORCH_CHECK(base != MAP_FAILED, "cannot map IDX file '", path, "': ", std::strerror(map_errno));
  return {static_cast<unsigned char*>(base), [size](unsigned char* p) { ::munmap(p, size); }};
}

// The IDX array of `path`, over a private mapping of the whole file, whose data is followed by
// `trailer` bytes (the cache's CRC, stored into *crc). Throws as read_idx does for a malformed file.
torch::Tensor map_plain(const std::string& path, size_t trailer, uint32_t* crc) {
  size_t size = 0;
  const auto file = map_whole_file(path, size);
  const unsigned char* bytes = file.get();
  const int ndim = idx_dimensions(bytes, path);
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  TORCH_CHECK(size >= header, "IDX file '", path, "' is truncated: expected ", header, " bytes of header, got ", size);
  const auto shape = idx_shape(bytes + 4, ndim, path);
  const size_t numel = static_cast<size_t>(c10::multiply_integers(shape));
  TORCH_CHECK(size >= header + numel + trailer, "IDX file '", path, "' is truncated: expected ", numel,
              " bytes of data, got ", size - header, "; re-download or reinstall the dataset");
  TORCH_CHECK(size == header + numel + trailer, "IDX file '", path,
              "' has data past the size its header declares; it is corrupt or not an IDX file");
  if (crc) std::memcpy(crc, bytes + header + numel, 4);  // written in this machine's byte order
  // The tensor owns the mapping: the last view of it unmaps the file.
  return torch::from_blob(file.get() + header, shape, [file](void*) {}, torch::kUInt8);
}

bool is_gzip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char magic[2] = {0, 0};
  in.read(reinterpret_cast<char*>(magic), 2);
  return in && magic[0] == 0x1f && magic[1] == 0x8b;
}

// The decompressed copy's name: the source's, keyed by where it is, its size and its modification
// time, so that a changed or moved source never matches an old copy.
std::string cache_file_for(const std::string& path, const std::string& cache_dir) {
  const fs::path source = fs::absolute(path);
  const auto stamp = fs::last_write_time(source).time_since_epoch().count();
  const size_t key = std::hash<std::string>{}(fmt::format("{}|{}|{}", source.string(), fs::file_size(source), stamp));
  std::string stem = source.filename().string();
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".gz") == 0) stem.resize(stem.size() - 3);
  return (fs::path(cache_dir) / fmt::format("{}-{:016x}.idx+crc32", stem, key)).string();
}

// The cached copy, mapped, if it is there and intact; else undefined (the caller rebuilds it).
torch::Tensor map_cached(const std::string& cache) {
  if (!fs::is_regular_file(cache)) return {};
  try {
    uint32_t stored = 0;
    auto array = map_plain(cache, 4, &stored);
    if (crc32_of(array) == stored) return array;
  } catch (const c10::Error&) {  // truncated or garbled: rebuilt like a missing copy
  }
  return {};
}

void write_cache(const std::string& cache, const torch::Tensor& array) {
  const uint32_t crc = crc32_of(array);
  const std::string header = idx_header(array.sizes());
  write_file_atomic(cache,
                    {header,
                     {reinterpret_cast<const char*>(array.data_ptr<uint8_t>()), static_cast<size_t>(array.numel())},
                     {reinterpret_cast<const char*>(&crc), 4}});
}

// The array's bytes, read as they arrive: memory grows with the data the file really holds, not with
// what its header declares (a 20-byte file may declare 16 GiB; gzip does not say its size up front).
torch::Tensor read_array(gzFile file, const std::string& path, const std::vector<int64_t>& shape) {
  constexpr size_t kChunk = size_t{64} << 20;
  const auto total = static_cast<size_t>(c10::multiply_integers(shape));
  std::vector<std::vector<uint8_t>> chunks;
  for (size_t done = 0; done < total;) {
    chunks.emplace_back(std::min(kChunk, total - done));
    read_exact(file, path, chunks.back().data(), chunks.back().size(), "data");
    done += chunks.back().size();
  }
  auto out = torch::empty(shape, torch::kUInt8);
  auto* dst = out.data_ptr<uint8_t>();
  for (const auto& chunk : chunks) dst = std::copy(chunk.begin(), chunk.end(), dst);
  return out;
}

}  // namespace

torch::Tensor read_idx(const std::string& path) {
  TORCH_CHECK(fs::is_regular_file(path), "IDX file '", path, "' does not exist");
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  TORCH_CHECK(file, "cannot open IDX file '", path, "' for reading");
  unsigned char header[4 + 4 * 4];
  read_exact(file.get(), path, header, 4, "header");
  const int ndim = idx_dimensions(header, path);
  read_exact(file.get(), path, header + 4, 4 * static_cast<size_t>(ndim), "header");
  auto out = read_array(file.get(), path, idx_shape(header + 4, ndim, path));
  unsigned char extra;
  TORCH_CHECK(gzread(file.get(), &extra, 1) == 0, "IDX file '", path,
              "' has data past the size its header declares; it is corrupt or not an IDX file");
  return out;
}

MappedIdx map_idx(const std::string& path, const std::string& cache_dir) {
  TORCH_CHECK(fs::is_regular_file(path), "IDX file '", path, "' does not exist");
  if (!is_gzip(path)) return {map_plain(path, 0, nullptr), path, ""};
  const std::string cache = cache_file_for(path, cache_dir);
  if (auto mapped = map_cached(cache); mapped.defined()) return {mapped, cache, ""};
  auto array = read_idx(path);
  try {
    write_cache(cache, array);
  } catch (const c10::Error& e) {
    return {array, "", e.what_without_backtrace()};
  }
  array = torch::Tensor();  // freed before the copy is mapped: one copy at the peak, not two
  auto mapped = map_cached(cache);
  TORCH_CHECK(mapped.defined(), "the decompressed copy '", cache, "' of '", path,
              "' was written but does not read back intact (is the disk failing?); remove it, or hold the data in "
              "memory (TrainOptions::map_data = false, `ampp train --data-in-memory`)");
  return {mapped, cache, ""};
}

}  // namespace ampp::train
