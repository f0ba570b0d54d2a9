#include <ampp/train/checkpoint.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace fs = std::filesystem;

namespace ampp::train {
namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

uint32_t crc32_of(const char* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {  // zlib's length argument is 32-bit
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

std::string errno_text() { return std::strerror(errno); }

// RAII file descriptor.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const fs::path target = fs::absolute(path);
  const fs::path dir = target.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK(fs::is_directory(dir), "cannot create checkpoint folder '", dir.string(), "': ", ec.message());
  // Same folder, so rename() is atomic (same file system); pid keeps concurrent writers apart.
  const fs::path tmp = dir / (target.filename().string() + ".tmp." + std::to_string(::getpid()));
  {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TORCH_CHECK(f.fd >= 0, "cannot create '", tmp.string(), "': ", errno_text(), "; check the folder is writable");
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = errno_text();
        fs::remove(tmp, ec);
        TORCH_CHECK(false, "writing checkpoint '", tmp.string(), "' failed: ", why, " (disk full?)");
      }
      done += static_cast<size_t>(n);
    }
    // The data must be on disk before the rename makes it visible under the real name.
    if (::fsync(f.fd) != 0) {
      const std::string why = errno_text();
      fs::remove(tmp, ec);
      TORCH_CHECK(false, "fsync of '", tmp.string(), "' failed: ", why);
    }
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const std::string why = errno_text();
    fs::remove(tmp, ec);
    TORCH_CHECK(false, "renaming '", tmp.string(), "' to '", target.string(), "' failed: ", why);
  }
  // Persist the directory entry too, or a power loss could forget the rename.
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd >= 0) ::fsync(d.fd);
}

void write_checkpoint_bytes(const std::string& path, const std::string& payload) {
  std::string file;
  file.reserve(kCheckpointHeaderSize + payload.size());
  file.append(kCheckpointMagic, sizeof(kCheckpointMagic));
  put_u32(file, kCheckpointVersion);
  put_u32(file, 0);
  put_u64(file, payload.size());
  put_u32(file, crc32_of(payload.data(), payload.size()));
  put_u32(file, crc32_of(file.data(), file.size()));
  file += payload;
  write_file_atomic(path, file);
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
  std::ostringstream out;
  archive.save_to(out);
  write_checkpoint_bytes(path, out.str());
}

void load_checkpoint(torch::serialize::InputArchive& archive, const std::string& path) {
  const std::string payload = read_checkpoint_bytes(path);
  try {
    archive.load_from(payload.data(), payload.size());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' passed its checksum but LibTorch cannot read the archive inside (",
                e.what(), "); it was not written by this version of ampp/LibTorch");
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

void save_amp(Amp& amp, torch::serialize::OutputArchive& archive) {
  for (const auto& [key, value] : amp.state_dict()) archive.write(key, value);
}

void load_amp(Amp& amp, torch::serialize::InputArchive& archive) {
  AmpStateDict state;
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    archive.read(key, value);
    state[key] = value;
  }
  amp.load_state_dict(state);
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
  return position;
}

}  // namespace

void save_training_checkpoint(const std::string& path, const TrainingObjects& objects, const RunPosition& position) {
  torch::serialize::OutputArchive file, model, optimizer, amp, sampler, trainer;
  objects.model.save(model);
  objects.optimizer.save(optimizer);
  save_amp(objects.amp, amp);
  objects.sampler.save(sampler);
  write_position(position, trainer);
  file.write("model", model);
  file.write("optimizer", optimizer);
  file.write("amp", amp);
  file.write("sampler", sampler);
  file.write("trainer", trainer);
  save_checkpoint(file, path);
}

TrainingCheckpoint::TrainingCheckpoint(const std::string& path) {
  load_checkpoint(archive_, path);
  torch::serialize::InputArchive trainer;
  archive_.read("trainer", trainer);
  position_ = read_position(trainer);
  trainer.read("rng_cpu", rng_state_);
}

void TrainingCheckpoint::restore(const TrainingObjects& objects) {
  torch::serialize::InputArchive model, amp, optimizer, sampler;
  archive_.read("model", model);
  objects.model.load(model);
  archive_.read("amp", amp);
  load_amp(objects.amp, amp);
  archive_.read("optimizer", optimizer);
  objects.optimizer.load(optimizer);
  archive_.read("sampler", sampler);
  objects.sampler.load(sampler);
  set_rng_state(rng_state_);
}

}  // namespace ampp::train
