#pragma once
// IDX files, the format of MNIST-style datasets: read into memory, or mapped so that the processes of
// one machine hold a single copy of the pixels.
#include <torch/torch.h>

#include <string>

namespace ampp::train {

// Reads one IDX file (gzip-compressed or plain; zlib reads both) into a uint8 tensor whose
// shape is the one in the file's header. Only unsigned-byte IDX files (type 0x08) are
// accepted, which is what MNIST-format datasets use. Throws c10::Error naming the file and
// the problem for a missing, truncated or malformed file.
torch::Tensor read_idx(const std::string& path);

struct MappedIdx {
  // uint8, the header's shape. When `file` is set its pages belong to the kernel's page cache and are
  // shared by every process of the machine that maps the file (copy-on-write: writing to the tensor
  // is allowed and changes only this process's copy).
  torch::Tensor array;
  std::string file;           // the mapped file: the IDX file itself, or its decompressed copy in the cache
  std::string why_in_memory;  // when `file` is "": why the array could not be mapped (it was read instead)
};

// The array of the IDX file at `path`, mapped. A plain file is mapped as it is. A gzip file is
// decompressed once into `cache_dir` (a file named after the source, keyed by its path, size and
// modification time, written atomically, with a CRC-32 of the pixels that every later load checks, so
// a damaged copy is rebuilt, never used); later loads and the other workers map that copy. When the
// copy cannot be written (read-only folder, full disk) the array is read into memory and
// `why_in_memory` says why. A malformed source throws as read_idx does.
MappedIdx map_idx(const std::string& path, const std::string& cache_dir);

}  // namespace ampp::train
