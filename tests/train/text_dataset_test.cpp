// Byte-level text (load_text, load_dataset "text:"): windows and their next tokens, the held-out tail,
// the unigram baseline, folders and clear errors.
#include <ampp/train/dataset.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "ampp_test.h"

using namespace ampp::train;

namespace {

void write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST(TextDataset, WindowsAreFollowedByTheirNextTokens) {
  ampp_test::TempDir dir;
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('a' + i % 26);
  write(dir / "t.txt", text);
  auto pair = load_text(dir.file("t.txt"), 4, 0.2);  // 80 training bytes, 20 held out
  EXPECT_TRUE(pair.train.tokens);
  EXPECT_EQ(pair.train.num_classes, 256);
  EXPECT_EQ(pair.train.size(), 19);  // (80 - 1) / 4
  EXPECT_EQ(pair.test.size(), 4);    // (20 - 1) / 4
  auto x = pair.train.select(torch::tensor({0, 2}, torch::kLong));
  EXPECT_EQ(x.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(x[0], torch::tensor({'a', 'b', 'c', 'd'}, torch::kLong)));
  EXPECT_TRUE(torch::equal(x[1], torch::tensor({'i', 'j', 'k', 'l'}, torch::kLong)));
  EXPECT_TRUE(torch::equal(pair.train.labels[0], torch::tensor({'b', 'c', 'd', 'e'}, torch::kLong)));
  // The test split starts at byte 80 ('c' = 'a' + 80 % 26).
  EXPECT_TRUE(torch::equal(pair.test.rows(0, 1)[0], torch::tensor({'c', 'd', 'e', 'f'}, torch::kLong)));
}

TEST(TextDataset, UnigramLossIsTheTrainingFrequenciesOnTheValidationText) {
  ampp_test::TempDir dir;
  write(dir / "t.txt", std::string(30, 'a') + std::string(10, 'b') + "aaaaabbbbb");  // held out: the last 10
  auto pair = load_text(dir.file("t.txt"), 2, 0.2);
  ASSERT_TRUE(pair.unigram_loss.has_value());
  // Training bytes: 30 a, 10 b, so p(a) = 31 / 296 and p(b) = 11 / 296 (add-one over 256 values); the
  // loss is the mean of -log p over the validation windows' labels.
  const auto labels = pair.test.labels.flatten();
  double expected = 0;
  for (int64_t i = 0; i < labels.numel(); ++i) {
    const int64_t t = labels[i].item<int64_t>();
    const double count = t == 'a' ? 30 : t == 'b' ? 10 : 0;
    expected -= std::log((count + 1) / (40.0 + 256));
  }
  expected /= static_cast<double>(labels.numel());
  EXPECT_NEAR(*pair.unigram_loss, expected, 1e-12);
  EXPECT_LT(*pair.unigram_loss, std::log(256.0));  // below the uniform guess
}

TEST(TextDataset, AFolderIsItsRegularFilesByNameWithoutIndexesOrLinks) {
  ampp_test::TempDir dir;
  write(dir / "b", std::string(50, 'b'));
  write(dir / "a", std::string(50, 'a'));
  write(dir / "a.dat", std::string(50, 'x'));  // a fortune index: binary, left out
  std::filesystem::create_symlink(dir / "a", dir / "a.u8");
  auto pair = load_text(dir.str(), 4, 0.5);  // 100 bytes: "a" x 50 then "b" x 50
  EXPECT_NE(pair.description.find("2 file(s), 100 bytes"), std::string::npos) << pair.description;
  EXPECT_EQ(pair.train.images.max().item<int64_t>(), 'a');
  EXPECT_EQ(pair.test.images.min().item<int64_t>(), 'b');
}

TEST(TextDataset, TooLittleTextAndMissingFilesAreClearErrors) {
  ampp_test::TempDir dir;
  write(dir / "short", "abcdefghij");
  AMPP_EXPECT_THROW_WITH(load_text(dir.file("short"), 8),
                         "has 10 bytes, too few for one training and one validation window of 8 tokens");
  AMPP_EXPECT_THROW_WITH(load_text(dir.file("none"), 8), "text '" + dir.file("none") + "' does not exist");
  AMPP_EXPECT_THROW_WITH(load_text(dir.file("short"), 0), "a text window needs at least one token");
  std::filesystem::create_directory(dir / "empty");
  AMPP_EXPECT_THROW_WITH(load_text(dir.file("empty"), 4), "holds no regular files");
}

TEST(TextDataset, LoadDatasetReadsTextSpecs) {
  ampp_test::TempDir dir;
  write(dir / "t.txt", std::string(200, 'z'));
  auto pair = load_dataset("text:" + dir.file("t.txt"), 0, 0, DataLoading().context(8));
  EXPECT_EQ(pair.train.images.size(1), 8);
  EXPECT_TRUE(pair.train.tokens);
}
