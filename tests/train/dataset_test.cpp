// IDX reader, MNIST-format folders, synthetic data and the batch iterator.
#include <ampp/train/batches.h>
#include <ampp/train/dataset.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "ampp_test.h"
#include "idx_files.h"

namespace fs = std::filesystem;
using namespace ampp::train;
using ampp_test::idx_bytes;
using ampp_test::iota_bytes;
using ampp_test::write_file;

namespace {

// A tiny MNIST-format folder: 6 training and 3 test images of 2x3 pixels (the hand computations below
// rely on its exact bytes).
void write_tiny_folder(const fs::path& dir, bool gzip) {
  const std::string gz = gzip ? ".gz" : "";
  write_file(dir / ("train-images-idx3-ubyte" + gz), idx_bytes({6, 2, 3}, iota_bytes(36)), gzip);
  write_file(dir / ("train-labels-idx1-ubyte" + gz), idx_bytes({6}, {0, 1, 2, 0, 1, 2}), gzip);
  write_file(dir / ("t10k-images-idx3-ubyte" + gz), idx_bytes({3, 2, 3}, iota_bytes(18)), gzip);
  write_file(dir / ("t10k-labels-idx1-ubyte" + gz), idx_bytes({3}, {2, 1, 0}), gzip);
}

}  // namespace

TEST(Idx, ReadsPlainAndGzipWithHeaderShape) {
  ampp_test::TempDir tmp;
  const auto bytes = iota_bytes(24);
  for (bool gzip : {false, true}) {
    const fs::path p = tmp.path() / (gzip ? "a.gz" : "a");
    write_file(p, idx_bytes({2, 3, 4}, bytes), gzip);
    auto t = read_idx(p.string());
    ASSERT_EQ(t.sizes(), (std::vector<int64_t>{2, 3, 4}));
    ASSERT_EQ(t.scalar_type(), torch::kUInt8);
    EXPECT_EQ(t[1][2][3].item<int>(), bytes[23]);
    EXPECT_EQ(t[0][1][0].item<int>(), bytes[4]);
  }
}

TEST(Idx, TruncatedFileIsAClearError) {
  ampp_test::TempDir tmp;
  auto bytes = idx_bytes({2, 3, 4}, iota_bytes(24));
  bytes.resize(bytes.size() - 5);
  write_file(tmp.path() / "t", bytes, false);
  AMPP_EXPECT_THROW_WITH(read_idx((tmp.path() / "t").string()), "truncated");
}

TEST(Idx, BadMagicTypeAndTrailingBytesAreClearErrors) {
  ampp_test::TempDir tmp;
  write_file(tmp.path() / "m", "PK\x03\x04garbage", false);
  AMPP_EXPECT_THROW_WITH(read_idx((tmp.path() / "m").string()), "not an IDX file");
  std::string wrong_type = idx_bytes({2}, {1, 2});
  wrong_type[2] = 0x0D;  // float
  write_file(tmp.path() / "f", wrong_type, false);
  AMPP_EXPECT_THROW_WITH(read_idx((tmp.path() / "f").string()), "only unsigned-byte");
  write_file(tmp.path() / "x", idx_bytes({2}, {1, 2, 3}), false);
  AMPP_EXPECT_THROW_WITH(read_idx((tmp.path() / "x").string()), "data past the size");
  AMPP_EXPECT_THROW_WITH(read_idx((tmp.path() / "missing").string()), "does not exist");
}

// Found by tests/fuzz/fuzz_idx (corpus/idx/huge_shape.idx): four sizes of 2^32-1 overflowed the
// element count (signed overflow, undefined behaviour) before the size check.
TEST(Idx, AHugeDeclaredShapeIsRefusedWithoutOverflow) {
  ampp_test::TempDir tmp;
  write_file(tmp.path() / "h", std::string("\0\0\x08\x04", 4) + std::string(16, '\xff'), false);
  AMPP_EXPECT_THROW_WITH(read_idx((tmp.path() / "h").string()), "declares an implausibly large array");
  AMPP_EXPECT_THROW_WITH(map_idx((tmp.path() / "h").string(), (tmp.path() / "cache").string()),
                         "declares an implausibly large array");
  // Found by fuzz_idx (corpus/idx/declares_16gb.idx): 20 bytes declaring 2 x 2,097,155 x 3,843 bytes
  // were answered with a 16 GB allocation before the data was read; memory now follows the data.
  write_file(tmp.path() / "g", std::string("\0\0\x08\x03\0\0\0\x02\0\x20\0\x03\0\0\x0f\x03", 16) + "\1\2\3\4", true);
  AMPP_EXPECT_THROW_WITH(read_idx((tmp.path() / "g").string()), "is truncated");
}

TEST(Idx, CorruptGzipIsAClearError) {
  ampp_test::TempDir tmp;
  write_file(tmp.path() / "g.gz", idx_bytes({64}, std::vector<uint8_t>(64, 9)), true);
  // Flip bytes inside the deflate stream: zlib reports a data error or a CRC mismatch.
  std::fstream f(tmp.path() / "g.gz", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(12);
  f.write("\xff\xff\xff\xff\xff\xff", 6);
  f.close();
  AMPP_EXPECT_THROW_WITH(read_idx((tmp.path() / "g.gz").string()), "IDX file");
}

TEST(MnistFolder, LoadsAndNormalisesWithTrainingStatistics) {
  for (bool gzip : {false, true}) {
    ampp_test::TempDir tmp;
    write_tiny_folder(tmp.path(), gzip);
    auto pair = load_mnist_folder(tmp.path().string(), 0, DataLoading().cache_dir((tmp.path() / "cache").string()));
    ASSERT_EQ(pair.train.images.sizes(), (std::vector<int64_t>{6, 1, 2, 3}));
    ASSERT_EQ(pair.test.images.sizes(), (std::vector<int64_t>{3, 1, 2, 3}));
    EXPECT_EQ(pair.train.labels[2].item<int64_t>(), 2);
    EXPECT_EQ(pair.test.labels[0].item<int64_t>(), 2);
    EXPECT_EQ(pair.train.num_classes, 3);
    // Hand computation: raw pixel k of the training set is (7k mod 256)/255.
    auto raw = torch::tensor(iota_bytes(36)).to(torch::kFloat32) / 255.0;
    const double mean = raw.mean().item<double>(), sd = raw.std().item<double>();
    EXPECT_EQ(pair.train.images.scalar_type(), torch::kUInt8);  // a quarter of float32's memory
    const auto train = pair.train.rows(0, 6), test = pair.test.rows(0, 3);
    EXPECT_EQ(train.scalar_type(), torch::kFloat32);
    EXPECT_NEAR(train.mean().item<double>(), 0.0, 1e-6);
    EXPECT_NEAR(train.std().item<double>(), 1.0, 1e-6);
    const double raw5 = (7 * 5 % 256) / 255.0;
    EXPECT_NEAR(train[0][0][1][2].item<double>(), (raw5 - mean) / sd, 1e-5);
    EXPECT_NEAR(test[0][0][1][2].item<double>(), (raw5 - mean) / sd, 1e-5);  // train statistics
    EXPECT_TRUE(torch::equal(pair.train.select(torch::tensor({4, 1})), torch::stack({train[4], train[1]})));
  }
}

TEST(MnistFolder, MissingFilesAndCountMismatchAreClearErrors) {
  ampp_test::TempDir tmp;
  AMPP_EXPECT_THROW_WITH(load_mnist_folder((tmp.path() / "nope").string()), "does not exist");
  AMPP_EXPECT_THROW_WITH(load_mnist_folder(tmp.path().string()), "train-images-idx3-ubyte");
  write_tiny_folder(tmp.path(), false);
  write_file(tmp.path() / "train-labels-idx1-ubyte", idx_bytes({5}, {0, 1, 2, 0, 1}), false);
  AMPP_EXPECT_THROW_WITH(load_mnist_folder(tmp.path().string()), "6 images but");
}

// A stray label (200 in a 3-class set) used to train a 201-class model silently.
TEST(MnistFolder, AStrayLabelIsRefusedUnlessTheClassCountIsGiven) {
  ampp_test::TempDir tmp;
  write_tiny_folder(tmp.path(), false);
  write_file(tmp.path() / "train-labels-idx1-ubyte", idx_bytes({6}, {0, 1, 2, 0, 200, 2}), false);
  const std::string error = ampp_test::error_of([&] { load_mnist_folder(tmp.path().string()); });
  EXPECT_THAT(error, ::testing::HasSubstr("has labels up to 200, but 197 of the classes 0..200 have no training image "
                                          "(the first: 3)"));
  EXPECT_THAT(error, ::testing::HasSubstr("TrainOptions::num_classes"));
  AMPP_EXPECT_THROW_WITH(load_mnist_folder(tmp.path().string(), 10),
                         "has label 200 but TrainOptions::num_classes is 10");
  EXPECT_EQ(load_mnist_folder(tmp.path().string(), 201).train.num_classes, 201);  // stated: trained as asked
  write_tiny_folder(tmp.path(), false);
  EXPECT_EQ(load_mnist_folder(tmp.path().string(), 5).train.num_classes, 5);  // empty classes allowed when stated
}

TEST(MappedIdx, PlainFileIsMappedAsItIsAndWritesStayPrivate) {
  ampp_test::TempDir tmp;
  const fs::path p = tmp.path() / "plain";
  write_file(p, idx_bytes({2, 3, 4}, iota_bytes(24)), false);
  auto m = map_idx(p.string(), (tmp.path() / "cache").string());
  EXPECT_EQ(m.file, p.string());
  ASSERT_TRUE(torch::equal(m.array, read_idx(p.string())));
  m.array.fill_(0);  // copy-on-write: this process's pages change, the file does not
  EXPECT_EQ(read_idx(p.string())[1][2][3].item<int>(), iota_bytes(24)[23]);
  EXPECT_FALSE(fs::exists(tmp.path() / "cache"));  // nothing to decompress
}

TEST(MappedIdx, MalformedPlainFilesAreTheSameClearErrors) {
  ampp_test::TempDir tmp;
  const std::string cache = (tmp.path() / "cache").string();
  auto bytes = idx_bytes({2, 3, 4}, iota_bytes(24));
  bytes.resize(bytes.size() - 5);
  write_file(tmp.path() / "t", bytes, false);
  AMPP_EXPECT_THROW_WITH(map_idx((tmp.path() / "t").string(), cache), "truncated");
  write_file(tmp.path() / "h", idx_bytes({2, 3, 4}, {}).substr(0, 9), false);
  AMPP_EXPECT_THROW_WITH(map_idx((tmp.path() / "h").string(), cache), "bytes of header");
  write_file(tmp.path() / "x", idx_bytes({2}, {1, 2, 3}), false);
  AMPP_EXPECT_THROW_WITH(map_idx((tmp.path() / "x").string(), cache), "data past the size");
  write_file(tmp.path() / "m", "PK\x03\x04garbage", false);
  AMPP_EXPECT_THROW_WITH(map_idx((tmp.path() / "m").string(), cache), "not an IDX file");
  AMPP_EXPECT_THROW_WITH(map_idx((tmp.path() / "missing").string(), cache), "does not exist");
}

// The mapped copy of a gzip file: made once, reused while intact, rebuilt when damaged or when the source changes.
TEST(MappedIdx, GzipIsDecompressedOnceIntoTheCacheAndDamageIsNeverUsed) {
  ampp_test::TempDir tmp;
  const fs::path gz = tmp.path() / "a-idx3-ubyte.gz";
  const std::string cache = (tmp.path() / "cache").string();
  write_file(gz, idx_bytes({3, 4, 5}, iota_bytes(60)), true);
  const auto expected = read_idx(gz.string());
  const auto first = map_idx(gz.string(), cache);
  ASSERT_EQ(fs::path(first.file).parent_path(), fs::path(cache));
  EXPECT_TRUE(torch::equal(first.array, expected));
  const auto written = fs::last_write_time(first.file);
  EXPECT_EQ(map_idx(gz.string(), cache).file, first.file);
  EXPECT_EQ(fs::last_write_time(first.file), written);  // reused, not rewritten
  for (const std::string damage : {"flip", "truncate"}) {
    if (damage == "flip") {
      std::fstream f(first.file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(20);
      f.put('\x7f');  // a pixel: only the CRC can tell
    } else {
      fs::resize_file(first.file, 30);
    }
    const auto again = map_idx(gz.string(), cache);
    EXPECT_EQ(again.file, first.file) << damage;
    EXPECT_TRUE(torch::equal(again.array, expected)) << damage;
  }
  write_file(gz, idx_bytes({2, 2}, {9, 8, 7, 6}), true);  // a changed source (size and time differ)
  fs::last_write_time(gz, written + std::chrono::seconds(5));
  const auto changed = map_idx(gz.string(), cache);
  EXPECT_NE(changed.file, first.file);
  EXPECT_TRUE(torch::equal(changed.array, read_idx(gz.string())));
}

TEST(MappedIdx, AnUnwritableCacheReadsIntoMemoryAndSaysWhy) {
  ampp_test::TempDir tmp;
  const fs::path gz = tmp.path() / "a.gz";
  write_file(gz, idx_bytes({4}, {1, 2, 3, 4}), true);
  write_file(tmp.path() / "blocker", "a file where the cache folder would be", false);
  const auto m = map_idx(gz.string(), (tmp.path() / "blocker" / "cache").string());
  EXPECT_EQ(m.file, "");
  EXPECT_THAT(m.why_in_memory, ::testing::HasSubstr("blocker"));
  EXPECT_TRUE(torch::equal(m.array, read_idx(gz.string())));
}

TEST(MnistFolder, ImagesAreMappedUnlessAskedToBeInMemory) {
  ampp_test::TempDir tmp;
  write_tiny_folder(tmp.path(), true);
  const auto cache = (tmp.path() / "cache").string();
  const auto mapped = load_mnist_folder(tmp.path().string(), 0, DataLoading().cache_dir(cache));
  const auto in_memory = load_mnist_folder(tmp.path().string(), 0, DataLoading().map_files(false));
  EXPECT_EQ(fs::path(mapped.train.images_file).parent_path(), fs::path(cache));
  EXPECT_EQ(fs::path(mapped.test.images_file).parent_path(), fs::path(cache));
  EXPECT_THAT(mapped.description, ::testing::HasSubstr("images mapped from " + cache));
  EXPECT_EQ(in_memory.train.images_file, "");
  EXPECT_THAT(in_memory.description, ::testing::HasSubstr("images in memory"));
  EXPECT_TRUE(torch::equal(mapped.train.rows(0, 6), in_memory.train.rows(0, 6)));
  EXPECT_TRUE(torch::equal(mapped.test.rows(0, 3), in_memory.test.rows(0, 3)));
}

TEST(Synthetic, SeededAndReproducible) {
  auto a = make_synthetic(SyntheticOptions().train_size(64).test_size(16).seed(3));
  auto b = make_synthetic(SyntheticOptions().train_size(64).test_size(16).seed(3));
  auto c = make_synthetic(SyntheticOptions().train_size(64).test_size(16).seed(4));
  EXPECT_TRUE(torch::equal(a.train.images, b.train.images));
  EXPECT_TRUE(torch::equal(a.test.labels, b.test.labels));
  EXPECT_FALSE(torch::equal(a.train.images, c.train.images));
  EXPECT_EQ(a.train.images.sizes(), (std::vector<int64_t>{64, 1, 28, 28}));
  EXPECT_LT(a.train.labels.max().item<int64_t>(), 10);
  EXPECT_EQ(load_dataset("synthetic:100").train.size(), 100);
  AMPP_EXPECT_THROW_WITH(load_dataset("synthetic:abc"), "synthetic:N");
}

TEST(Batches, FollowsTheIndexListAndResumesMidway) {
  auto pair = make_synthetic(SyntheticOptions().train_size(10).test_size(2));
  BatchIterator it(pair.train, {9, 3, 5, 1, 0, 7, 2}, 3, /*drop_last=*/false);
  EXPECT_EQ(it.num_batches(), 3);
  auto b0 = it.next();
  ASSERT_TRUE(b0);
  EXPECT_TRUE(torch::equal(b0->target, pair.train.labels.index_select(0, torch::tensor({9, 3, 5}))));
  EXPECT_TRUE(torch::equal(b0->data[1], pair.train.images[3]));
  it.next();
  auto last = it.next();
  ASSERT_TRUE(last);
  EXPECT_EQ(last->data.size(0), 1);  // the short final batch
  EXPECT_FALSE(it.next());

  BatchIterator dropped(pair.train, {9, 3, 5, 1, 0, 7, 2}, 3, /*drop_last=*/true);
  EXPECT_EQ(dropped.num_batches(), 2);
  dropped.skip_to(1);
  EXPECT_TRUE(torch::equal(dropped.next()->target, pair.train.labels.index_select(0, torch::tensor({1, 0, 7}))));
  EXPECT_FALSE(dropped.next());
  AMPP_EXPECT_THROW_WITH(BatchIterator(pair.train, {10}, 2, false), "out of range");
}
