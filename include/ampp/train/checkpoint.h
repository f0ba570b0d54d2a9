#pragma once
// Checkpoint files for `ampp train`: a torch::serialize archive wrapped in a small checked
// container and written atomically.
//
// File layout (little-endian):
//   0  8 bytes  magic "AMPPCKPT"
//   8  u32      format version (1)
//  12  u32      reserved (0)
//  16  u64      payload length in bytes
//  24  u32      CRC32 of the payload
//  28  u32      CRC32 of bytes 0..27 (the header itself)
//  32  payload  torch::serialize::OutputArchive bytes
//
// Writing: temporary file in the same folder, write, fsync(file), rename over the target,
// fsync(folder). A process killed at any point leaves either the previous file or the new
// one, both complete. Reading checks magic, version, length and both CRCs before LibTorch
// parses anything, so a truncated or corrupted file is a clear error rather than a crash.
#include <torch/torch.h>

#include <string>

namespace ampp::train {

inline constexpr char kCheckpointMagic[8] = {'A', 'M', 'P', 'P', 'C', 'K', 'P', 'T'};
inline constexpr uint32_t kCheckpointVersion = 1;
inline constexpr size_t kCheckpointHeaderSize = 32;

// Low level: container around raw payload bytes.
void write_checkpoint_bytes(const std::string& path, const std::string& payload);
std::string read_checkpoint_bytes(const std::string& path);

// Archive level.
void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path);
// Throws c10::Error naming the file and the problem (missing, truncated, corrupted, not a
// checkpoint, unreadable archive).
void load_checkpoint(torch::serialize::InputArchive& archive, const std::string& path);

// Writes `bytes` to `path` atomically (temp file + fsync + rename + fsync of the folder).
void write_file_atomic(const std::string& path, const std::string& bytes);

// The global CPU generator's state (torch::manual_seed's stream), to save and restore.
torch::Tensor get_rng_state();
void set_rng_state(const torch::Tensor& state);

}  // namespace ampp::train
