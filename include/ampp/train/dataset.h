#pragma once
// Datasets for `ampp train`: MNIST-format IDX folders (Fashion-MNIST by default), held in memory as
// the files' uint8 pixels and standardised per batch (a quarter of float32's memory), a seeded
// synthetic set, held as standardised float tensors, and byte-level text in fixed-length windows.
#include <ampp/train/idx_file.h>
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ampp::train {

// Where Debian's `dataset-fashion-mnist` package installs its gzip IDX files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// One split, entirely in memory.
struct Dataset {
  // [N, C, H, W]: uint8 pixels as the files hold them (standardised by select()/rows()), or float32
  // values already standardised (synthetic data); text: [N, T] uint8 tokens (select()/rows() give int64).
  torch::Tensor images;
  torch::Tensor labels;  // [N] int64; text: [N, T] int64, each window's next tokens
  bool tokens = false;   // text windows, not images
  int64_t num_classes = 10;
  // uint8 images become (x / 255 - pixel_mean) / pixel_std in float32 (the training split's statistics).
  double pixel_mean = 0, pixel_std = 1;
  // The file `images` maps (shared with the machine's other processes that map it), or "" when they
  // are in this process's memory (DatasetPair::description says why, when mapping was asked).
  std::string images_file;
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  // The standardised float32 images at `indices` (int64), or of rows [begin, end).
  torch::Tensor select(const torch::Tensor& indices) const;
  torch::Tensor rows(int64_t begin, int64_t end) const;
};

struct DatasetPair {
  Dataset train;
  Dataset test;
  std::string description;  // e.g. "fashion-mnist (/usr/share/...): 60000 train, 10000 test"
  // Text: the validation loss (nats per token) of the training text's token frequencies (add-one
  // smoothed), the bar a language model must clear.
  std::optional<double> unigram_loss;
};

// How MNIST-format folders are held.
struct DataLoading {
  // Map the uint8 images from a file the processes of this machine share (ampp::train::map_idx: the
  // workers of a run hold one copy, not one each); false reads them into each process's memory.
  TORCH_ARG(bool, map_files) = true;
  // Where gzip files are decompressed once to be mapped; "" = ampp::user_cache_dir()/datasets.
  TORCH_ARG(std::string, cache_dir) = "";
  // Text: tokens per window (the model's context).
  TORCH_ARG(int64_t, context) = 64;
};

// Loads an MNIST-format folder: train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each optionally with .gz; the
// "train-images.idx3-ubyte" spelling is accepted too). Images are kept as uint8; select()/rows() scale
// them to [0,1] and standardise them with the training split's mean and standard deviation (computed
// exactly, in double, from the pixel histogram), mapped from files as `loading` says. num_classes > 0 states the
// number of classes (a larger label is an error); 0 takes max label + 1 and refuses a gap (a class
// below the largest label with no training image, the sign of a stray label).
DatasetPair load_mnist_folder(const std::string& dir, int64_t num_classes = 0, const DataLoading& loading = {});

struct SyntheticOptions {
  TORCH_ARG(int64_t, train_size) = 2048;
  TORCH_ARG(int64_t, test_size) = 512;
  TORCH_ARG(int64_t, num_classes) = 10;
  TORCH_ARG(uint64_t, seed) = 0;
  // Noise around the class prototypes; larger is harder.
  TORCH_ARG(double, noise) = 1.0;
};

// A seeded, learnable 1x28x28 classification set (class prototypes plus Gaussian noise):
// the same options give bit-identical tensors on every process.
DatasetPair make_synthetic(const SyntheticOptions& options = {});

// Where Debian's `fortunes` package installs its text files: the default text.
inline constexpr const char* kDefaultTextDir = "/usr/share/games/fortunes";

// Byte-level text from a file, or from every regular file of a folder (by name; the `.dat` indexes of
// fortune files and symbolic links are left out), in non-overlapping windows of `context` tokens with
// their next tokens as labels. The last `validation_fraction` of the bytes is the test split.
DatasetPair load_text(const std::string& path, int64_t context, double validation_fraction = 0.1);

// The name runs record for a `--data` spec (fingerprints, layout cache keys): "" is "fashion-mnist".
inline std::string dataset_name(const std::string& spec) { return spec.empty() ? "fashion-mnist" : spec; }

// `spec` as given to `ampp train --data`: "" or "fashion-mnist" -> the Debian package's
// folder (an error naming `apt install dataset-fashion-mnist` if absent), "synthetic" or
// "synthetic:N" (N training images) -> make_synthetic, "text" or "text:PATH" -> load_text (kDefaultTextDir,
// or PATH) with loading.context(), anything else -> an MNIST-format folder.
// num_classes: as for load_mnist_folder; for synthetic data the number of classes (0: 10).
DatasetPair load_dataset(const std::string& spec, uint64_t synthetic_seed = 0, int64_t num_classes = 0,
                         const DataLoading& loading = {});

}  // namespace ampp::train
