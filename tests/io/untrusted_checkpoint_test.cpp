// torch.save files from outside are untrusted: issue 27's reproductions, rebuilt from their
// descriptions (malformed_files.h), each give one line naming the file and the problem, or load
// correctly where the file is valid. The fuzzers (tests/fuzz) start from the same files.
#include <ampp/io/pytorch_checkpoint.h>

#include "ampp/io/pickle_guard.h"
#include "ampp_test.h"
#include "malformed_files.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace {

std::string write(const ampp_test::TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = (dir.path() / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The error load_pytorch() gives for `bytes`: exactly one line, naming the file.
std::string load_error(const std::string& bytes) {
  ampp_test::TempDir dir;
  const std::string path = write(dir, "checkpoint.pt", bytes);
  const std::string message = ampp_test::error_of([&] { ampp::load_pytorch(path); });
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_THAT(message, ::testing::HasSubstr("cannot read '" + path + "' as a torch.save file: "));
  return message;
}

using ::testing::HasSubstr;

}  // namespace

TEST(UntrustedCheckpoint, ARecordShorterThanItsStorageIsRefused) {
  EXPECT_THAT(load_error(malformed::short_record(0)),
              HasSubstr("record 'data/0' holds 0 bytes, but the pickle declares a storage of 802816 bytes"));
  EXPECT_THAT(load_error(malformed::short_record(16)),
              HasSubstr("record 'data/0' holds 16 bytes, but the pickle declares a storage of 802816 bytes"));
}

TEST(UntrustedCheckpoint, DeepNestingIsRefusedWithoutRecursion) {
  for (const bool tuples : {false, true})
    for (const size_t depth : {size_t{100000}, size_t{200000}})
      EXPECT_THAT(load_error(malformed::deep_nesting(depth, tuples)),
                  HasSubstr("nests objects deeper than 256 levels"));
  EXPECT_THAT(load_error(malformed::deep_nesting(1000000, false)), HasSubstr("deeper than 256 levels"));
}

TEST(UntrustedCheckpoint, NestingUpToTheLimitLoads) {
  ampp_test::TempDir dir;
  constexpr size_t limit = ampp::detail::kMaxPickleDepth;
  for (const bool tuples : {false, true}) {
    // Lists: `limit` lists. Tuples: the empty tuple inside `limit - 1` one-element tuples.
    c10::IValue v =
        ampp::load_pytorch(write(dir, "deep.pt", malformed::deep_nesting(tuples ? limit - 1 : limit, tuples)));
    size_t depth = 0;
    while (tuples ? v.isTuple() : v.isList()) {
      ++depth;
      if (tuples ? v.toTupleRef().elements().empty() : v.toListRef().empty()) break;
      v = tuples ? c10::IValue(v.toTupleRef().elements()[0]) : c10::IValue(v.toListRef()[0]);
    }
    EXPECT_EQ(depth, limit);
  }
  EXPECT_THAT(load_error(malformed::deep_nesting(limit + 1, false)), HasSubstr("deeper than 256 levels"));
}

TEST(UntrustedCheckpoint, EveryRecordsCrc32IsChecked) {
  for (int bit = 0; bit < 8; ++bit)
    EXPECT_THAT(load_error(malformed::flipped_bit(1000 + 37 * bit, bit)),
                HasSubstr("record 'data/0' is corrupted (its CRC-32 does not match the zip directory)"));
}

TEST(UntrustedCheckpoint, MemoIndicesCyclesAndGlobalsAreChecked) {
  EXPECT_THAT(load_error(malformed::huge_memo_index()), HasSubstr("memo index 4294967280 at byte 3 is out of order"));
  EXPECT_THAT(load_error(malformed::self_containing_list()), HasSubstr("an object contains itself"));
  EXPECT_THAT(load_error(malformed::foreign_global()),
              HasSubstr("the pickle calls os.system, which ampp does not load"));
}

TEST(UntrustedCheckpoint, TruncatedOrForeignZipsAreOneLineErrors) {
  const std::string valid = malformed::cuda_location();
  for (const size_t keep : {size_t{2}, size_t{100}, valid.size() / 2, valid.size() - 1})
    load_error(valid.substr(0, keep));
  std::string garbage_directory = valid;
  for (size_t i = garbage_directory.size() - 200; i < garbage_directory.size() - 22; ++i) garbage_directory[i] = '\x7f';
  load_error(garbage_directory);
}

// A storage saved on a GPU loads on the CPU (map_location="cpu"), never through a device copy of
// bytes whose size is not yet checked.
TEST(UntrustedCheckpoint, AStorageSavedOnCudaLoadsOnTheCpu) {
  ampp_test::TempDir dir;
  const auto loaded = ampp::load_pytorch(write(dir, "cuda.pt", malformed::cuda_location())).toGenericDict();
  const torch::Tensor w = loaded.at("fc1.weight").toTensor();
  EXPECT_TRUE(w.device().is_cpu());
  EXPECT_TRUE(torch::equal(w, malformed::fc1_weight()));
}

// PyTorch's load_state_dict fill_()s the scale, so an int or a one-element tensor loads; a string is
// one line naming the key, not "INTERNAL ASSERT FAILED ... please report a bug to PyTorch".
TEST(UntrustedCheckpoint, TheScalersNumbersAreTypeChecked) {
  ampp::GradScaler scaler;
  auto state = ampp::scaler_state_dict(scaler);
  state.insert_or_assign("scale", int64_t{128});
  ampp::load_scaler_state_dict(scaler, state);
  EXPECT_EQ(scaler.get_scale(), 128.0);
  state.insert_or_assign("scale", torch::tensor(256.0));
  ampp::load_scaler_state_dict(scaler, state);
  EXPECT_EQ(scaler.get_scale(), 256.0);
  state.insert_or_assign("scale", std::string("65536"));
  const std::string message = ampp_test::error_of([&] { ampp::load_scaler_state_dict(scaler, state); });
  EXPECT_THAT(message, HasSubstr("\"scale\" must be a number, got String"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("INTERNAL ASSERT")));
  state.insert_or_assign("scale", 65536.0);
  state.insert_or_assign("growth_factor", 0.0);
  AMPP_EXPECT_THROW_WITH(ampp::load_scaler_state_dict(scaler, state), "The growth factor must be > 1.0");
}

TEST(UntrustedCheckpoint, WrongTypesInAStateDictAreOneLineErrors) {
  auto model = torch::nn::Linear(2, 2);
  auto state = ampp::make_pytorch_dict();
  state.insert("weight", int64_t{3});
  AMPP_EXPECT_THROW_WITH(ampp::load_module_state_dict(*model, state), "state dict entry \"weight\" is not a tensor");
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto opt = ampp::optimizer_state_dict(sgd);
  opt.insert_or_assign("param_groups", std::string("x"));
  AMPP_EXPECT_THROW_WITH(ampp::load_optimizer_state_dict(sgd, opt), "\"param_groups\" must be a list, got String");
}

// With AMPP_WRITE_CORPUS=<folder>, writes the files above as the fuzzers' seed corpus; otherwise
// checks that each committed corpus file behaves as its description: the same error, or the same load
// (bytes may differ between LibTorch versions, whose zip writers differ).
TEST(UntrustedCheckpoint, TheFuzzCorpusHoldsEveryReproduction) {
  const char* out = std::getenv("AMPP_WRITE_CORPUS");
  const fs::path corpus = out != nullptr ? fs::path(out) : fs::path(AMPP_FUZZ_CORPUS_DIR) / "pt";
  ampp_test::TempDir dir;
  auto outcome = [](const std::string& path) {
    std::string result = ampp_test::error_of([&] { ampp::load_pytorch(path); });
    return result.substr(result.find(" as a torch.save file") + 1);  // without the path
  };
  for (const auto& [name, bytes] : malformed::all()) {
    if (out != nullptr) {
      fs::create_directories(corpus);
      std::ofstream(corpus / name, std::ios::binary) << bytes;
      continue;
    }
    ASSERT_TRUE(fs::exists(corpus / name))
        << (corpus / name) << " is missing; regenerate with AMPP_WRITE_CORPUS=" << corpus;
    EXPECT_EQ(outcome((corpus / name).string()), outcome(write(dir, name, bytes))) << name;
  }
}
