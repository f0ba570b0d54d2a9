#pragma once
// TensorBoard event files: what `ampp train --tensorboard DIR` writes, and a small writer any
// LibTorch program can use.
//
//   ampp::train::TensorBoardWriter tb("runs/exp1");
//   tb.add_scalar("train/loss", loss.item<double>(), step);
//   tb.flush();                                  // also done by the destructor
//
// The file is TensorBoard's own format (what tf.summary and torch.utils.tensorboard write): records of
// serialized `Event` messages (protobuf), each framed by its length and the masked CRC-32C of the
// length and of the data. Scalars are float32 in that format, as in PyTorch's SummaryWriter.
// (No LibTorch header here: the protobuf code that encodes the events is built apart from LibTorch,
// whose wheel carries protobuf headers of its own.)
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace ampp {
class GradientRanges;  // <ampp/scaling/gradient_ranges.h>
}

namespace ampp::train {

struct StepRecord;  // <ampp/train/metrics.h>
struct EpochRecord;

/// A histogram as TensorBoard stores it: bucket[i] counts the values in (bucket_limit[i-1],
/// bucket_limit[i]] (the first bucket from -infinity).
struct TensorBoardHistogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit;
  std::vector<double> bucket;
};

class TensorBoardWriter {
 public:
  /// Creates `log_dir` if needed and a new event file in it, named as TensorBoard expects
  /// (events.out.tfevents.<seconds>.<host>.<pid>.<n>); a resumed run adds a file beside the old ones,
  /// which TensorBoard reads as one run. Throws naming the folder when it cannot be written.
  explicit TensorBoardWriter(const std::string& log_dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  /// Several scalars of one step in one record.
  void add_scalars(const std::vector<std::pair<std::string, double>>& tagged_values, int64_t step);
  void add_histogram(const std::string& tag, const TensorBoardHistogram& histogram, int64_t step);
  /// Pushes what was written to the file; throws naming the file when the write failed (a full disk).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event_bytes);
  std::string path_;
  std::ofstream out_;
};

/// The masked CRC-32C of TensorBoard's (TFRecord's) framing: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

/// The scalars of metrics.jsonl's records, tagged "train/..." (per logged step, at its step) and
/// "epoch/..." (per epoch, at the step that ended it, so both share TensorBoard's step axis).
void log_to_tensorboard(TensorBoardWriter& tb, const StepRecord& r);
void log_to_tensorboard(TensorBoardWriter& tb, const EpochRecord& r);

/// The doctor's gradient exponent histograms (log2 |gradient| of every step observed so far, unscaled),
/// one per parameter, tagged "doctor/log2_grad/<parameter>".
void log_to_tensorboard(TensorBoardWriter& tb, const GradientRanges& ranges, int64_t step);

}  // namespace ampp::train
