#include <ampp/train/dataset.h>
#include <ampp/util/parse_number.h>

#include <fmt/format.h>
#include <zlib.h>

#include <array>
#include <cmath>
#include <filesystem>
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

uint32_t big_endian_u32(const unsigned char* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

// The first existing spelling of an MNIST-format file name in `dir`, or "".
std::string find_file(const fs::path& dir, const std::string& stem, const std::string& kind) {
  for (const std::string& name : {stem + "-" + kind, stem + "." + kind}) {
    for (const char* ext : {"", ".gz"}) {
      const fs::path p = dir / (name + ext);
      if (fs::is_regular_file(p)) return p.string();
    }
  }
  return "";
}

Dataset make_split(const torch::Tensor& images_u8, const torch::Tensor& labels_u8, const std::string& images_path,
                   const std::string& labels_path) {
  TORCH_CHECK(images_u8.dim() == 3, "IDX file '", images_path, "' holds a ", images_u8.dim(),
              "-d array; MNIST-format images are 3-d (count, rows, columns)");
  TORCH_CHECK(labels_u8.dim() == 1, "IDX file '", labels_path, "' holds a ", labels_u8.dim(),
              "-d array; MNIST-format labels are 1-d");
  TORCH_CHECK(images_u8.size(0) == labels_u8.size(0), "'", images_path, "' has ", images_u8.size(0), " images but '",
              labels_path, "' has ", labels_u8.size(0), " labels; the two files must come from the same dataset");
  TORCH_CHECK(images_u8.size(0) > 0, "IDX file '", images_path, "' holds no images");
  Dataset d;
  d.images = images_u8.unsqueeze(1);  // uint8: standardised per batch
  d.labels = labels_u8.to(torch::kInt64);
  return d;
}

// Standardise both splits with the training split's statistics (no test-set leakage): mean and
// unbiased standard deviation of x / 255, exact in double from the 256-bin histogram, so no float
// copy of the whole set is ever made (it would be the peak of a worker's memory).
void normalise_pixels(DatasetPair& pair) {
  std::array<int64_t, 256> counts{};
  const auto pixels = pair.train.images.contiguous();
  const uint8_t* p = pixels.data_ptr<uint8_t>();
  for (int64_t i = 0; i < pixels.numel(); ++i) ++counts[p[i]];
  const double n = static_cast<double>(pixels.numel());
  double sum = 0, squares = 0;
  for (int v = 0; v < 256; ++v) sum += static_cast<double>(counts[v]) * (v / 255.0);
  const double mean = sum / n;
  for (int v = 0; v < 256; ++v) squares += static_cast<double>(counts[v]) * (v / 255.0 - mean) * (v / 255.0 - mean);
  double stddev = n > 1 ? std::sqrt(squares / (n - 1)) : 0.0;
  if (stddev < 1e-12) stddev = 1.0;  // constant images: only centre them
  for (Dataset* d : {&pair.train, &pair.test}) {
    d->pixel_mean = mean;
    d->pixel_std = stddev;
  }
}

// Float images (synthetic) are standardised in place, once.
void normalise_floats(DatasetPair& pair) {
  const double mean = pair.train.images.mean().item<double>();
  double stddev = pair.train.images.std().item<double>();
  if (stddev < 1e-12) stddev = 1.0;
  pair.train.images.sub_(mean).div_(stddev);
  pair.test.images.sub_(mean).div_(stddev);
}

torch::Tensor standardised(const Dataset& d, torch::Tensor images) {
  if (images.scalar_type() != torch::kUInt8) return images;
  return images.to(torch::kFloat32).div_(255.0).sub_(d.pixel_mean).div_(d.pixel_std);
}

}  // namespace

torch::Tensor read_idx(const std::string& path) {
  TORCH_CHECK(fs::is_regular_file(path), "IDX file '", path, "' does not exist");
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  TORCH_CHECK(file, "cannot open IDX file '", path, "' for reading");
  unsigned char magic[4];
  read_exact(file.get(), path, magic, 4, "header");
  TORCH_CHECK(magic[0] == 0 && magic[1] == 0, "'", path,
              "' is not an IDX file (bad magic number); expected an MNIST-format file such as train-images-idx3-ubyte");
  TORCH_CHECK(magic[2] == 0x08, "IDX file '", path, "' has element type 0x", fmt::format("{:02x}", magic[2]),
              "; only unsigned-byte (0x08) IDX files are supported, as in MNIST-format datasets");
  const int ndim = magic[3];
  TORCH_CHECK(ndim >= 1 && ndim <= 4, "IDX file '", path, "' declares ", ndim, " dimensions; expected 1 to 4");
  std::vector<int64_t> shape(ndim);
  int64_t numel = 1;
  for (int i = 0; i < ndim; ++i) {
    unsigned char b[4];
    read_exact(file.get(), path, b, 4, "header");
    shape[i] = big_endian_u32(b);
    numel *= shape[i];
    TORCH_CHECK(numel <= (int64_t{1} << 34), "IDX file '", path,
                "' declares an implausibly large array; it is corrupt");
  }
  auto out = torch::empty(shape, torch::kUInt8);
  read_exact(file.get(), path, out.data_ptr<uint8_t>(), static_cast<size_t>(numel), "data");
  unsigned char extra;
  TORCH_CHECK(gzread(file.get(), &extra, 1) == 0, "IDX file '", path,
              "' has data past the size its header declares; it is corrupt or not an IDX file");
  return out;
}

// The number of classes: `declared` when > 0 (every label must be below it), else max label + 1,
// refused when some class below the largest label has no training image: a stray label (200 in
// a 10-class set) would otherwise train a 201-class model without a word.
int64_t count_classes(const DatasetPair& pair, const std::string& dir, int64_t declared) {
  const int64_t largest = std::max(pair.train.labels.max().item<int64_t>(), pair.test.labels.max().item<int64_t>());
  if (declared > 0) {
    TORCH_CHECK(largest < declared, "dataset '", dir, "' has label ", largest, " but TrainOptions::num_classes is ",
                declared, "; labels must be 0..", declared - 1);
    return std::max<int64_t>(declared, 2);
  }
  const auto counts = at::bincount(pair.train.labels, /*weights=*/{}, largest + 1);
  const int64_t empty = counts.eq(0).sum().item<int64_t>();
  TORCH_CHECK(empty == 0, "dataset '", dir, "' has labels up to ", largest, ", but ", empty, " of the classes 0..",
              largest, " have no training image (the first: ", counts.eq(0).nonzero()[0].item<int64_t>(),
              "); a stray label? Set TrainOptions::num_classes to the real number of classes to train anyway");
  return std::max<int64_t>(largest + 1, 2);
}

DatasetPair load_mnist_folder(const std::string& dir, int64_t num_classes) {
  TORCH_CHECK(fs::is_directory(dir), "dataset folder '", dir, "' does not exist (or is not a folder)");
  DatasetPair pair;
  std::vector<std::string> paths;
  for (const auto& [stem, kind] : std::vector<std::pair<std::string, std::string>>{{"train-images", "idx3-ubyte"},
                                                                                   {"train-labels", "idx1-ubyte"},
                                                                                   {"t10k-images", "idx3-ubyte"},
                                                                                   {"t10k-labels", "idx1-ubyte"}}) {
    std::string p = find_file(dir, stem, kind);
    TORCH_CHECK(!p.empty(), "dataset folder '", dir, "' has no ", stem, "-", kind,
                "[.gz]; an MNIST-format folder holds ",
                "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte ",
                "(gzip or not)");
    paths.push_back(p);
  }
  pair.train = make_split(read_idx(paths[0]), read_idx(paths[1]), paths[0], paths[1]);
  pair.test = make_split(read_idx(paths[2]), read_idx(paths[3]), paths[2], paths[3]);
  TORCH_CHECK(pair.train.images.sizes().slice(1) == pair.test.images.sizes().slice(1), "training images are ",
              pair.train.images.sizes(), " but test images are ", pair.test.images.sizes(), " in '", dir,
              "'; both splits must have the same image size");
  pair.train.num_classes = pair.test.num_classes = count_classes(pair, dir, num_classes);
  normalise_pixels(pair);
  pair.description = fmt::format("{} ({} train, {} test images of {}x{})", dir, pair.train.size(), pair.test.size(),
                                 pair.train.images.size(2), pair.train.images.size(3));
  return pair;
}

torch::Tensor Dataset::select(const torch::Tensor& indices) const {
  return standardised(*this, images.index_select(0, indices));
}

torch::Tensor Dataset::rows(int64_t begin, int64_t end) const {
  return standardised(*this, images.slice(0, begin, end));
}

DatasetPair make_synthetic(const SyntheticOptions& o) {
  TORCH_CHECK(o.train_size() > 0 && o.test_size() > 0, "synthetic dataset sizes must be positive");
  TORCH_CHECK(o.num_classes() >= 2, "a synthetic dataset needs at least 2 classes");
  // A private generator: the data never depends on (or disturbs) the global RNG.
  auto gen = at::detail::createCPUGenerator(o.seed());
  auto prototypes = at::normal(0.0, 1.0, {o.num_classes(), 1, 28, 28}, gen);
  auto split = [&](int64_t n) {
    Dataset d;
    d.labels = at::randint(o.num_classes(), {n}, gen, torch::kInt64);
    d.images = prototypes.index_select(0, d.labels) + o.noise() * at::normal(0.0, 1.0, {n, 1, 28, 28}, gen);
    d.num_classes = o.num_classes();
    return d;
  };
  DatasetPair pair;
  pair.train = split(o.train_size());
  pair.test = split(o.test_size());
  normalise_floats(pair);
  pair.description = fmt::format("synthetic (seed {}: {} train, {} test images of 28x28, {} classes)", o.seed(),
                                 o.train_size(), o.test_size(), o.num_classes());
  return pair;
}

DatasetPair load_dataset(const std::string& spec, uint64_t synthetic_seed, int64_t num_classes) {
  if (dataset_name(spec) == "fashion-mnist") {
    TORCH_CHECK(fs::is_directory(kFashionMnistDir), "Fashion-MNIST not found in ", kFashionMnistDir,
                ": install it with `sudo apt install dataset-fashion-mnist`, or set TrainOptions::data to an "
                "MNIST-format folder or to synthetic");
    auto pair = load_mnist_folder(kFashionMnistDir, num_classes);
    pair.description = "fashion-mnist " + pair.description;
    return pair;
  }
  if (spec == "synthetic" || spec.rfind("synthetic:", 0) == 0) {
    SyntheticOptions o;
    o.seed(synthetic_seed);
    if (num_classes > 0) o.num_classes(num_classes);
    if (spec.size() > 10) {
      const auto size = parse_int(std::string_view(spec).substr(10));
      TORCH_CHECK(size && *size > 0, "TrainOptions::data '", spec,
                  "': expected synthetic:N with N a positive number of training images");
      o.train_size(*size).test_size(std::max<int64_t>(*size / 4, 1));
    }
    return make_synthetic(o);
  }
  return load_mnist_folder(spec, num_classes);
}

}  // namespace ampp::train
