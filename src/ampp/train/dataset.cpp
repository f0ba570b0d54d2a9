#include <ampp/train/dataset.h>
#include <ampp/util/cache_dir.h>
#include <ampp/util/parse_number.h>

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

namespace fs = std::filesystem;

namespace ampp::train {
namespace {

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

Dataset make_split(const MappedIdx& images, const torch::Tensor& labels_u8, const std::string& images_path,
                   const std::string& labels_path) {
  const torch::Tensor& images_u8 = images.array;
  TORCH_CHECK(images_u8.dim() == 3, "IDX file '", images_path, "' holds a ", images_u8.dim(),
              "-d array; MNIST-format images are 3-d (count, rows, columns)");
  TORCH_CHECK(labels_u8.dim() == 1, "IDX file '", labels_path, "' holds a ", labels_u8.dim(),
              "-d array; MNIST-format labels are 1-d");
  TORCH_CHECK(images_u8.size(0) == labels_u8.size(0), "'", images_path, "' has ", images_u8.size(0), " images but '",
              labels_path, "' has ", labels_u8.size(0), " labels; the two files must come from the same dataset");
  TORCH_CHECK(images_u8.size(0) > 0, "IDX file '", images_path, "' holds no images");
  Dataset d;
  d.images = images_u8.unsqueeze(1);  // uint8: standardised per batch
  d.images_file = images.file;
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
  if (d.tokens) return images.to(torch::kInt64);
  if (images.scalar_type() != torch::kUInt8) return images;
  return images.to(torch::kFloat32).div_(255.0).sub_(d.pixel_mean).div_(d.pixel_std);
}

}  // namespace

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

DatasetPair load_mnist_folder(const std::string& dir, int64_t num_classes, const DataLoading& loading) {
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
  const auto images = [&](const std::string& path) {
    if (!loading.map_files()) return MappedIdx{read_idx(path), "", ""};
    const std::string cache = loading.cache_dir().empty() ? user_cache_dir() + "/datasets" : loading.cache_dir();
    return map_idx(path, cache);
  };
  const MappedIdx train_images = images(paths[0]);
  pair.train = make_split(train_images, read_idx(paths[1]), paths[0], paths[1]);
  pair.test = make_split(images(paths[2]), read_idx(paths[3]), paths[2], paths[3]);
  TORCH_CHECK(pair.train.images.sizes().slice(1) == pair.test.images.sizes().slice(1), "training images are ",
              pair.train.images.sizes(), " but test images are ", pair.test.images.sizes(), " in '", dir,
              "'; both splits must have the same image size");
  pair.train.num_classes = pair.test.num_classes = count_classes(pair, dir, num_classes);
  normalise_pixels(pair);
  std::string residence = "images in memory";
  if (!train_images.file.empty())
    residence = "images mapped from " + fs::path(train_images.file).parent_path().string() + ", shared by this machine";
  else if (!train_images.why_in_memory.empty())
    residence += ", not mapped: " + train_images.why_in_memory;
  pair.description = fmt::format("{} ({} train, {} test images of {}x{}; {})", dir, pair.train.size(), pair.test.size(),
                                 pair.train.images.size(2), pair.train.images.size(3), residence);
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

DatasetPair load_dataset(const std::string& spec, uint64_t synthetic_seed, int64_t num_classes,
                         const DataLoading& loading) {
  if (dataset_name(spec) == "fashion-mnist") {
    TORCH_CHECK(fs::is_directory(kFashionMnistDir), "Fashion-MNIST not found in ", kFashionMnistDir,
                ": install it with `sudo apt install dataset-fashion-mnist`, or set TrainOptions::data to an "
                "MNIST-format folder or to synthetic");
    auto pair = load_mnist_folder(kFashionMnistDir, num_classes, loading);
    pair.description = "fashion-mnist " + pair.description;
    return pair;
  }
  if (spec == "text") return load_text(kDefaultTextDir, loading.context());
  if (spec.rfind("text:", 0) == 0) return load_text(spec.substr(5), loading.context());
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
  return load_mnist_folder(spec, num_classes, loading);
}

}  // namespace ampp::train
