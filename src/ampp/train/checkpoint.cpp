#include <ampp/train/checkpoint.h>
#include <ampp/train/named_master_params.h>
#include <ampp/train/pytorch_training_checkpoint.h>

#include <ampp/io/archive_reader.h>
#include <ampp/util/archive_bytes.h>
#include <ampp/util/atomic_file.h>
#include <ampp/util/crc32.h>
#include <ampp/util/little_endian.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <utility>

#include "torch_compat.h"

namespace fs = std::filesystem;

namespace ampp::train {
namespace {

// An error's message without LibTorch's C++ backtrace: one line for the user.
std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

}  // namespace

std::string checkpoint_file_bytes(const std::string& payload) {
  std::string file;
  file.reserve(kCheckpointHeaderSize + payload.size());
  file.append(kCheckpointMagic, sizeof(kCheckpointMagic));
  put_le(file, kCheckpointVersion, 4);
  put_le(file, 0, 4);
  put_le(file, payload.size(), 8);
  put_le(file, crc32_of(payload.data(), payload.size()), 4);
  put_le(file, crc32_of(file.data(), file.size()), 4);
  file += payload;
  return file;
}

void write_checkpoint_bytes(const std::string& path, const std::string& payload) {
  write_file_atomic(path, checkpoint_file_bytes(payload));
}

std::string read_checkpoint_bytes(const std::string& path) {
  TORCH_CHECK(fs::is_regular_file(path), "checkpoint '", path, "' does not exist");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot open checkpoint '", path, "' for reading");
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const char* fix = "; delete it to start afresh, or point TrainOptions::checkpoint_dir at an intact checkpoint";
  TORCH_CHECK(file.size() >= sizeof(kCheckpointMagic) &&
                  std::memcmp(file.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) == 0,
              "'", path, "' is not an ampp checkpoint (bad magic)", file.size() < 8 ? " or is truncated" : "", fix);
  TORCH_CHECK(file.size() >= kCheckpointHeaderSize, "checkpoint '", path, "' is truncated: only ", file.size(),
              " bytes, less than its ", kCheckpointHeaderSize, "-byte header", fix);
  TORCH_CHECK(get_le(file.data() + 28, 4) == crc32_of(file.data(), 28), "checkpoint '", path,
              "' is corrupted: its header checksum does not match", fix);
  const auto version = static_cast<uint32_t>(get_le(file.data() + 8, 4));
  TORCH_CHECK(version == kCheckpointVersion, "checkpoint '", path, "' has format version ", version,
              " but this ampp reads version ", kCheckpointVersion, "; resume it with the ampp that wrote it");
  const uint64_t length = get_le(file.data() + 16, 8);
  const uint64_t present = file.size() - kCheckpointHeaderSize;
  TORCH_CHECK(present >= length, "checkpoint '", path, "' is truncated: the header announces ", length,
              " payload bytes but only ", present, " are present", fix);
  TORCH_CHECK(present == length, "checkpoint '", path, "' is corrupted: ", present - length,
              " unexpected bytes after the payload", fix);
  const auto crc = static_cast<uint32_t>(get_le(file.data() + 24, 4));
  TORCH_CHECK(crc == crc32_of(file.data() + kCheckpointHeaderSize, length), "checkpoint '", path,
              "' is corrupted: the payload's CRC32 does not match its header", fix);
  return file.substr(kCheckpointHeaderSize);
}

void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path) {
  write_checkpoint_bytes(path, archive_bytes(archive));
}

void load_checkpoint(torch::serialize::InputArchive& archive, const std::string& path,
                     std::optional<c10::Device> map_location) {
  std::string payload = read_checkpoint_bytes(path);
  try {
    read_archive(archive, std::move(payload), map_location);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' passed its checksum but the archive inside cannot be read (",
                first_line(e), "); it was not written by this version of ampp/LibTorch");
  }
}

torch::Tensor get_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

namespace {

void save_amp(const TrainingObjects& objects, torch::serialize::OutputArchive& archive) {
  StateDict state = objects.amp.state_dict();
  if (state.contains("master_params")) state.insert_or_assign("master_params", checkpoint_masters(objects));
  for (const auto& item : state) archive.write(item.key(), item.value());
}

void load_amp(const TrainingObjects& objects, torch::serialize::InputArchive& archive) {
  StateDict state = make_state_dict();
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    archive.read(key, value);
    state.insert(key, value);
  }
  const auto masters = state.find("master_params");
  if (masters != state.end() && masters->value().isTensorList())
    masters->setValue(local_masters(masters->value().toTensorVector(), objects));
  objects.amp.load_state_dict(state);
}

void write_position(const RunPosition& position, torch::serialize::OutputArchive& archive) {
  const EpochSums& sums = position.epoch_sums;
  archive.write("fingerprint", c10::IValue(position.fingerprint));
  archive.write("epoch", c10::IValue(position.epoch));
  archive.write("batch", c10::IValue(position.batch));
  archive.write("global_step", c10::IValue(position.global_step));
  archive.write("skipped_total", c10::IValue(position.skipped_total));
  archive.write("elapsed", c10::IValue(position.elapsed));
  archive.write("epoch_sums", c10::IValue(std::vector<double>{sums.loss_sum, sums.correct, sums.seen}));
  archive.write("last_train_loss", c10::IValue(position.last_train_loss));
  archive.write("rng_cpu", get_rng_state(), /*is_buffer=*/true);
}

c10::IValue read_value(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  archive.read(key, value);
  return value;
}

RunPosition read_position(torch::serialize::InputArchive& archive) {
  RunPosition position;
  position.fingerprint = read_value(archive, "fingerprint").toStringRef();
  position.epoch = read_value(archive, "epoch").toInt();
  position.batch = read_value(archive, "batch").toInt();
  position.global_step = read_value(archive, "global_step").toInt();
  position.skipped_total = read_value(archive, "skipped_total").toInt();
  position.elapsed = read_value(archive, "elapsed").toDouble();
  const auto sums = read_value(archive, "epoch_sums").toDoubleVector();
  TORCH_CHECK(sums.size() == 3, "checkpoint: epoch_sums has ", sums.size(), " entries, expected 3");
  position.epoch_sums = {sums[0], sums[1], sums[2]};
  c10::IValue last_train_loss;  // absent in checkpoints written before it was added
  if (archive.try_read("last_train_loss", last_train_loss)) position.last_train_loss = last_train_loss.toDouble();
  // A valid CRC says the bytes arrived as written, not that they are sane.
  TORCH_CHECK(position.epoch >= 0 && position.batch >= 0 && position.global_step >= 0 && position.skipped_total >= 0 &&
                  position.skipped_total <= position.global_step && std::isfinite(position.elapsed) &&
                  position.elapsed >= 0,
              "its position is impossible (epoch ", position.epoch, ", batch ", position.batch, ", step ",
              position.global_step, ", ", position.skipped_total, " skipped, ", position.elapsed, " s)");
  return position;
}

}  // namespace

std::string training_checkpoint_bytes(const TrainingObjects& objects, const RunPosition& position) {
  torch::serialize::OutputArchive file, model, optimizer, amp, sampler, trainer;
  objects.model.save(model);
  objects.optimizer.save(optimizer);
  save_amp(objects, amp);
  objects.sampler.save(sampler);
  write_position(position, trainer);
  file.write("model", model);
  file.write("optimizer", optimizer);
  file.write("amp", amp);
  file.write("sampler", sampler);
  file.write("trainer", trainer);
  return checkpoint_file_bytes(archive_bytes(file));
}

void save_training_checkpoint(const std::string& path, const TrainingObjects& objects, const RunPosition& position) {
  write_file_atomic(path, training_checkpoint_bytes(objects, position));
}

TrainingCheckpoint::TrainingCheckpoint(const std::string& path, std::optional<c10::Device> map_location) : path_(path) {
  load_checkpoint(archive_, path, map_location);
  try {
    torch::serialize::InputArchive trainer;
    archive_.read("trainer", trainer);
    position_ = read_position(trainer);
    trainer.read("rng_cpu", rng_state_);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' is not a training checkpoint of this ampp (", first_line(e),
                "); delete it to start afresh, or point TrainOptions::checkpoint_dir at another one");
  }
}

namespace {

// Under O2 a cast parameter that trains has an FP32 master (Amp::state_dict() lists exactly these).
bool has_master_entry(const TrainingObjects& objects, const torch::Tensor& param) {
  return param.requires_grad() && objects.amp.was_cast(param);
}

}  // namespace

std::vector<torch::Tensor> checkpoint_masters(const TrainingObjects& objects) {
  const auto named = named_master_params(objects.model, objects.amp);
  const auto params = objects.model.named_parameters();
  TORCH_CHECK(objects.masters.empty() || objects.masters.size() == named.size(), "TrainingObjects::masters has ",
              objects.masters.size(), " tensors for ", named.size(), " parameters");
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < named.size(); ++i) {
    if (!has_master_entry(objects, params[named[i].first])) continue;  // its own master (BatchNorm under O2)
    out.push_back((objects.masters.empty() ? named[i].second : objects.masters[i]).detach());
  }
  return out;
}

std::vector<torch::Tensor> local_masters(const std::vector<torch::Tensor>& saved, const TrainingObjects& objects) {
  const auto params = objects.model.named_parameters();
  std::vector<torch::Tensor> out;
  size_t j = 0;
  for (const auto& [name, master] : named_master_params(objects.model, objects.amp)) {
    if (!has_master_entry(objects, params[name])) continue;
    TORCH_CHECK(j < saved.size(), "the checkpoint has ", saved.size(), " master weights, fewer than this model's");
    if (!master.is_same(params[name])) out.push_back(saved[j]);  // a master this process steps
    ++j;
  }
  TORCH_CHECK(j == saved.size(), "the checkpoint has ", saved.size(), " master weights but this model has ", j);
  return out;
}

void TrainingCheckpoint::restore(const TrainingObjects& objects) {
  try {
    restore_objects(objects);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "checkpoint '", path_, "' does not fit this run's model, optimizer or loss scaler (",
                first_line(e), "); resume with the options that wrote it");
  }
}

void TrainingCheckpoint::restore_objects(const TrainingObjects& objects) {
  torch::serialize::InputArchive model, amp, optimizer, sampler;
  archive_.read("model", model);
  objects.model.load(model);
  archive_.read("amp", amp);
  load_amp(objects, amp);
  archive_.read("optimizer", optimizer);
  objects.optimizer.load(optimizer);
  compat::load_sgd_options(optimizer, objects.optimizer);
  archive_.read("sampler", sampler);
  objects.sampler.load(sampler);
  set_rng_state(rng_state_);
}

}  // namespace ampp::train
