// TensorBoardWriter: the record framing TensorBoard's reader checks (length, masked CRC-32C of the
// length and of the data) and clear errors. That TensorBoard reads the values back is checked with
// TensorBoard's own reader in tensorboard_cli_test.cpp.
#include <ampp/train/tensorboard.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <ampp/util/little_endian.h>
#include "ampp_test.h"

namespace fs = std::filesystem;
using ampp::get_le;
using ampp::train::masked_crc32c;
using ampp::train::TensorBoardWriter;

namespace {

// The data of every record, each checked against its framing.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size()) << "a record header is cut off at byte " << at;
    const uint64_t length = get_le(bytes.data() + at, 8);
    EXPECT_EQ(get_le(bytes.data() + at + 8, 4), masked_crc32c(bytes.data() + at, 8)) << "length CRC at byte " << at;
    EXPECT_LE(at + 16 + length, bytes.size()) << "record data cut off at byte " << at;
    const std::string data = bytes.substr(at + 12, length);
    EXPECT_EQ(get_le(bytes.data() + at + 12 + length, 4), masked_crc32c(data.data(), data.size()))
        << "data CRC at " << at;
    records.push_back(data);
    at += 16 + length;
  }
  return records;
}

}  // namespace

TEST(TensorBoard, MaskedCrc32cOfTheStandardCheckInput) {
  // CRC-32C("123456789") is 0xE3069283 (the check value of the Castagnoli polynomial); TFRecord masks it.
  const uint32_t crc = 0xE3069283u;
  const uint32_t masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  EXPECT_EQ(masked_crc32c("123456789", 9), masked);
  EXPECT_NE(masked_crc32c("123456780", 9), masked);
}

TEST(TensorBoard, EveryRecordIsFramedWithItsLengthAndChecksums) {
  ampp_test::TempDir tmp;
  std::string path;
  {
    TensorBoardWriter tb((tmp.path() / "runs" / "a").string());  // the folders are created
    path = tb.path();
    EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos) << path;
    tb.add_scalar("train/loss", 0.25, 3);
    tb.add_scalars({{"a", 1.0}, {"b", 2.0}}, 4);
    ampp::train::TensorBoardHistogram h;
    h.num = 3;
    h.bucket_limit = {1, 2};
    h.bucket = {1, 2};
    tb.add_histogram("h", h, 5);
  }  // the destructor flushes
  const auto records = read_records(path);
  ASSERT_EQ(records.size(), 4u);  // the file version, then one per call
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(records[1].find("train/loss"), std::string::npos);
}

TEST(TensorBoard, TwoWritersOfOneFolderWriteTwoFiles) {
  ampp_test::TempDir tmp;
  TensorBoardWriter a(tmp.path().string()), b(tmp.path().string());
  EXPECT_NE(a.path(), b.path());
}

TEST(TensorBoard, AFileInTheWayOfTheFolderIsAClearError) {
  ampp_test::TempDir tmp;
  const auto file = tmp.path() / "not-a-folder";
  std::ofstream(file) << "x";
  try {
    TensorBoardWriter tb(file.string());
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create the log folder"), std::string::npos) << e.what();
  }
}

TEST(TensorBoard, HistogramsNeedAsManyBucketsAsLimits) {
  ampp_test::TempDir tmp;
  TensorBoardWriter tb(tmp.path().string());
  ampp::train::TensorBoardHistogram h;
  h.bucket_limit = {1, 2};
  h.bucket = {1};
  EXPECT_THROW(tb.add_histogram("h", h, 0), c10::Error);
}
