// Byte-level text for the GPTs: every byte is a token (vocabulary 256), so any file is valid input and
// no tokenizer is needed.
#include <ampp/train/dataset.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

namespace fs = std::filesystem;

namespace ampp::train {
namespace {

constexpr int64_t kVocabulary = 256;
constexpr int64_t kMaxTextBytes = int64_t{1} << 31;  // labels are int64: 8 bytes of memory per byte of text

std::vector<fs::path> text_files(const fs::path& path) {
  TORCH_CHECK(fs::exists(path), "text '", path.string(), "' does not exist",
              path == kDefaultTextDir ? "; install Debian's `fortunes` package (sudo apt install fortunes) or name a "
                                        "file with TrainOptions::data text:FILE"
                                      : "");
  if (!fs::is_directory(path)) return {path};
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(path))
    if (entry.is_regular_file() && !entry.is_symlink() && entry.path().extension() != ".dat")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  TORCH_CHECK(!files.empty(), "text folder '", path.string(), "' holds no regular files");
  return files;
}

std::string read_bytes(const std::vector<fs::path>& files) {
  std::string text;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    TORCH_CHECK(in, "cannot read text file '", file.string(), "'");
    std::array<char, 1 << 16> chunk{};
    while (in.read(chunk.data(), chunk.size()) || in.gcount() > 0) {
      text.append(chunk.data(), static_cast<size_t>(in.gcount()));
      TORCH_CHECK(static_cast<int64_t>(text.size()) <= kMaxTextBytes, "the text is over ", kMaxTextBytes,
                  " bytes; name a smaller file");
    }
  }
  return text;
}

// Non-overlapping windows of `context` tokens over bytes [begin, end); labels are the windows shifted by one.
Dataset windows(const torch::Tensor& bytes, int64_t begin, int64_t end, int64_t context) {
  const int64_t n = (end - begin - 1) / context;
  Dataset d;
  d.tokens = true;
  d.num_classes = kVocabulary;
  d.images = bytes.slice(0, begin, begin + n * context).view({n, context}).clone();
  d.labels = bytes.slice(0, begin + 1, begin + 1 + n * context).view({n, context}).to(torch::kInt64);
  return d;
}

// -mean log p(label) over the test windows, p the training text's byte frequencies with add-one smoothing
// (so an unseen byte costs log(train bytes + 256), not infinity).
double unigram_loss(const torch::Tensor& train_bytes, const torch::Tensor& test_labels) {
  const auto counts = torch::bincount(train_bytes.to(torch::kInt64), {}, kVocabulary).to(torch::kFloat64);
  const auto log_p = (counts + 1).log() - std::log(static_cast<double>(train_bytes.numel() + kVocabulary));
  return -log_p.index_select(0, test_labels.flatten()).mean().item<double>();
}

}  // namespace

DatasetPair load_text(const std::string& path, int64_t context, double validation_fraction) {
  TORCH_CHECK(context >= 1, "a text window needs at least one token, got context ", context);
  TORCH_CHECK(validation_fraction > 0 && validation_fraction < 1, "validation_fraction must be in (0, 1), got ",
              validation_fraction);
  const auto files = text_files(path);
  const std::string text = read_bytes(files);
  const auto n = static_cast<int64_t>(text.size());
  const auto tail = static_cast<int64_t>(std::ceil(n * validation_fraction));
  TORCH_CHECK(n - tail > context && tail > context, "text '", path, "' has ", n,
              " bytes, too few for one training and ", "one validation window of ", context,
              " tokens (and their next tokens); use more text or a shorter context");
  auto bytes = torch::empty({n}, torch::kUInt8);
  std::copy(text.begin(), text.end(), reinterpret_cast<char*>(bytes.data_ptr<uint8_t>()));
  DatasetPair pair;
  pair.train = windows(bytes, 0, n - tail, context);
  pair.test = windows(bytes, n - tail, n, context);
  pair.unigram_loss = unigram_loss(bytes.slice(0, 0, n - tail), pair.test.labels);
  pair.description = fmt::format(
      "text {} ({} file(s), {} bytes: {} training and {} validation windows of {} tokens, "
      "byte-level vocabulary of {})",
      path, files.size(), n, pair.train.size(), pair.test.size(), context, kVocabulary);
  return pair;
}

}  // namespace ampp::train
