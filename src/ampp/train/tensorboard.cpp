// TensorBoard event files: protobuf messages (tensorboard_event.proto) in TFRecord framing.
#include <ampp/scaling/gradient_ranges.h>
#include <ampp/train/metrics.h>
#include <ampp/train/tensorboard.h>
#include <ampp/util/little_endian.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/crc.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "events/tensorboard_events.h"

namespace ampp::train {
namespace {

namespace fs = std::filesystem;

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// TensorBoard orders a run's files by name, so the name starts with the creation time; the counter
// keeps two writers of one process and second apart.
std::string event_file_name() {
  static std::atomic<int> created{0};
  return fmt::format("events.out.tfevents.{}.{}.{}.{}", static_cast<int64_t>(wall_time()), host_name(), ::getpid(),
                     created++);
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  // CRC-32C (Castagnoli): polynomial 0x1EDC6F41, reflected, initial and final XOR all ones.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  // The mask keeps a CRC of data that itself holds CRCs from being trivially related to them.
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  TORCH_CHECK(!ec && fs::is_directory(log_dir), "TensorBoard: cannot create the log folder '", log_dir,
              "': ", ec ? ec.message() : "a file of that name is in the way", "; pass another --tensorboard folder");
  path_ = (fs::path(log_dir) / event_file_name()).string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out_.good(), "TensorBoard: cannot write '", path_, "': ", std::strerror(errno));
  write_record(detail::file_version_event(wall_time()));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (out_.is_open()) out_.flush();  // a destructor must not throw: flush() reports failures
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  record.reserve(data.size() + 16);
  put_le(record, data.size(), 8);
  put_le(record, masked_crc32c(record.data(), 8), 4);
  record += data;
  put_le(record, masked_crc32c(data.data(), data.size()), 4);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  add_scalars({{tag, value}}, step);
}

void TensorBoardWriter::add_scalars(const std::vector<std::pair<std::string, double>>& tagged_values, int64_t step) {
  write_record(detail::scalars_event(wall_time(), step, tagged_values));
}

void TensorBoardWriter::add_histogram(const std::string& tag, const TensorBoardHistogram& h, int64_t step) {
  TORCH_CHECK(h.bucket.size() == h.bucket_limit.size(), "TensorBoard histogram '", tag, "': ", h.bucket.size(),
              " buckets but ", h.bucket_limit.size(), " bucket limits");
  write_record(detail::histogram_event(wall_time(), step, tag, h));
}

void TensorBoardWriter::flush() {
  out_.flush();
  TORCH_CHECK(out_.good(), "TensorBoard: writing '", path_, "' failed (is the disk full?)");
}

void log_to_tensorboard(TensorBoardWriter& tb, const StepRecord& r) {
  tb.add_scalars({{"train/loss", r.loss},
                  {"train/loss_scale", r.loss_scale},
                  {"train/skipped_steps", static_cast<double>(r.skipped_total)},
                  {"train/lr", r.lr},
                  {"train/images_per_sec", r.images_per_sec}},
                 r.step);
  tb.flush();
}

void log_to_tensorboard(TensorBoardWriter& tb, const EpochRecord& r) {
  tb.add_scalars({{"epoch/train_loss", r.train_loss},
                  {"epoch/train_accuracy", r.train_accuracy},
                  {"epoch/test_loss", r.test_loss},
                  {"epoch/test_accuracy", r.test_accuracy},
                  {"epoch/images_per_sec", r.images_per_sec},
                  {"epoch/loss_scale", r.loss_scale},
                  {"epoch/lr", r.lr}},
                 r.steps);
  tb.flush();
}

namespace {

// The exponent histogram of one parameter as a histogram of log2 |gradient|: the bin of exponent e
// holds [e, e + 1). Sums use the bins' middles (the report keeps counts, not values).
TensorBoardHistogram log2_histogram(const GradientRanges::Parameter& p) {
  TensorBoardHistogram h;
  const auto& bins = p.unscaled;
  size_t first = bins.size(), last = 0;
  for (size_t i = 0; i < bins.size(); ++i) {
    if (bins[i] == 0) continue;
    first = std::min(first, i);
    last = i;
  }
  if (first == bins.size()) return h;
  h.min = GradientRanges::kLowestExponent + static_cast<double>(first);
  h.max = GradientRanges::kLowestExponent + static_cast<double>(last) + 1;
  for (size_t i = first; i <= last; ++i) {
    const double e = GradientRanges::kLowestExponent + static_cast<double>(i), n = static_cast<double>(bins[i]);
    h.bucket_limit.push_back(e + 1);
    h.bucket.push_back(n);
    h.num += n;
    h.sum += n * (e + 0.5);
    h.sum_squares += n * (e + 0.5) * (e + 0.5);
  }
  return h;
}

}  // namespace

void log_to_tensorboard(TensorBoardWriter& tb, const GradientRanges& ranges, int64_t step) {
  for (const auto& p : ranges.parameters()) {
    const auto h = log2_histogram(p);
    if (h.num > 0) tb.add_histogram("doctor/log2_grad/" + p.name, h, step);
  }
  tb.flush();
}

}  // namespace ampp::train
