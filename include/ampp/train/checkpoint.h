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
// Writing: ampp::write_file_atomic (temporary file in the same folder, write, fsync(file), rename
// over the target, fsync(folder)). A process killed at any point leaves either the previous file or the new
// one, both complete. Reading checks magic, version, length and both CRCs before LibTorch
// parses anything, so a truncated or corrupted file is a clear error rather than a crash.
//
// A training checkpoint (save_training_checkpoint / TrainingCheckpoint) holds five archives: "model",
// "optimizer", "amp" (loss scalers, apex's state_dict keys), "sampler" and "trainer" (RunPosition
// and the global CPU RNG state).
#include <ampp/amp/amp.h>
#include <ampp/dist/sampler.h>

#include <torch/torch.h>

#include <optional>
#include <string>

namespace ampp::train {

inline constexpr char kCheckpointMagic[8] = {'A', 'M', 'P', 'P', 'C', 'K', 'P', 'T'};
inline constexpr uint32_t kCheckpointVersion = 1;
inline constexpr size_t kCheckpointHeaderSize = 32;

// Low level: container around raw payload bytes.
std::string checkpoint_file_bytes(const std::string& payload);  // header + payload
void write_checkpoint_bytes(const std::string& path, const std::string& payload);
std::string read_checkpoint_bytes(const std::string& path);

// Archive level.
void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path);
// Throws c10::Error naming the file and the problem (missing, truncated, corrupted, not a
// checkpoint, unreadable archive). Tensors go to `map_location` when given (read_archive), else to the
// devices they were saved on.
void load_checkpoint(torch::serialize::InputArchive& archive, const std::string& path,
                     std::optional<c10::Device> map_location = std::nullopt);

// The global CPU generator's state (torch::manual_seed's stream), to save and restore.
torch::Tensor get_rng_state();
void set_rng_state(const torch::Tensor& state);

// Running sums of an epoch's training loss and accuracy.
struct EpochSums {
  double loss_sum = 0;
  double correct = 0;
  double seen = 0;
};

// Where a run stands, stored next to the model, optimizer, amp and sampler states.
struct RunPosition {
  std::string fingerprint;  // the run's identity (model, data, precision, ...): another run is refused
  int64_t epoch = 0;        // the epoch to continue
  int64_t batch = 0;        // batches of that epoch already done
  int64_t global_step = 0;
  int64_t skipped_total = 0;
  double elapsed = 0;          // seconds of training so far
  EpochSums epoch_sums;        // the epoch's running sums as global totals (meaningful on rank 0)
  double last_train_loss = 0;  // the last finished epoch's mean training loss (for a finished run's summary)
};

// The live objects a training checkpoint is written from and read into.
struct TrainingObjects {
  torch::nn::Module& model;
  torch::optim::Optimizer& optimizer;
  Amp& amp;
  dist::DistributedSampler& sampler;
  // What the optimizer steps, one tensor per model parameter in Amp::master_params()'s order (the FP32
  // masters under O2), when this process does not hold them all: under ZeRO each rank holds its shard's
  // masters, gathered here for a checkpoint (save only). Empty: amp.master_params(), which holds them all.
  std::vector<torch::Tensor> masters = {};
};

// The O2 masters a checkpoint holds: the FP32 ones of the low-precision parameters, in the optimizer's order
// (the model's for one param group), as Amp::state_dict() lists them without ZeRO (so a checkpoint resumes
// with or without it).
std::vector<torch::Tensor> checkpoint_masters(const TrainingObjects& objects);

// The inverse on load: of a checkpoint's masters, the ones this process's Amp steps (under ZeRO its shard's).
std::vector<torch::Tensor> local_masters(const std::vector<torch::Tensor>& saved, const TrainingObjects& objects);

// The bytes of a checkpoint file (header + archive) of the objects, the position and the global
// CPU RNG state.
std::string training_checkpoint_bytes(const TrainingObjects& objects, const RunPosition& position);

// Writes training_checkpoint_bytes atomically to `path`.
void save_training_checkpoint(const std::string& path, const TrainingObjects& objects, const RunPosition& position);

// A training checkpoint read and checked; restore() then loads it into the objects.
class TrainingCheckpoint {
 public:
  // `map_location`: the device its tensors are loaded onto (each rank its own; read_archive).
  explicit TrainingCheckpoint(const std::string& path, std::optional<c10::Device> map_location = std::nullopt);
  const RunPosition& position() const { return position_; }
  // Loads model, amp, optimizer and sampler states and the global CPU RNG state; an archive that does
  // not fit the objects is a one-line error naming the file.
  void restore(const TrainingObjects& objects);

 private:
  void restore_objects(const TrainingObjects& objects);
  std::string path_;
  torch::serialize::InputArchive archive_;
  RunPosition position_;
  torch::Tensor rng_state_;
};

}  // namespace ampp::train
