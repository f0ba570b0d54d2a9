// Checkpoint container: round trip, atomic replacement, truncation/corruption detection.
#include <ampp/amp/initialize.h>
#include <ampp/train/checkpoint.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ampp_test.h"

namespace fs = std::filesystem;
using namespace ampp::train;

namespace {
void spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }
}  // namespace

TEST(Checkpoint, ArchiveRoundTripIsExact) {
  ampp_test::TempDir tmp;
  const auto path = (tmp.path() / "sub" / "ckpt").string();  // folder created on demand
  auto w = torch::randn({5, 7});
  torch::serialize::OutputArchive out;
  out.write("w", w);
  out.write("step", c10::IValue(int64_t{42}));
  save_checkpoint(out, path);

  torch::serialize::InputArchive in;
  load_checkpoint(in, path);
  torch::Tensor w2;
  in.read("w", w2);
  c10::IValue step;
  in.read("step", step);
  EXPECT_TRUE(torch::equal(w, w2));
  EXPECT_EQ(step.toInt(), 42);
  // Header fields as documented.
  const std::string file = ampp_test::read_file(path);
  EXPECT_EQ(file.substr(0, 8), "AMPPCKPT");
  EXPECT_EQ(static_cast<unsigned char>(file[8]), kCheckpointVersion);
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));  // no temp file left
}

TEST(Checkpoint, TruncationAtEveryRegionIsAClearError) {
  ampp_test::TempDir tmp;
  const auto path = tmp.path() / "c";
  write_checkpoint_bytes(path.string(), std::string(1000, 'x'));
  const std::string good = ampp_test::read_file(path);
  for (size_t keep : {size_t{0}, size_t{5}, size_t{20}, size_t{32}, size_t{500}, good.size() - 1}) {
    spit(path, good.substr(0, keep));
    AMPP_EXPECT_THROW_WITH(read_checkpoint_bytes(path.string()), keep < 8 ? "not an ampp checkpoint" : "truncated");
  }
}

TEST(Checkpoint, FlippedBitsAreDetected) {
  ampp_test::TempDir tmp;
  const auto path = tmp.path() / "c";
  write_checkpoint_bytes(path.string(), std::string(1000, 'x'));
  const std::string good = ampp_test::read_file(path);
  for (size_t at : {size_t{17}, size_t{25}, size_t{40}, good.size() - 1}) {
    std::string bad = good;
    bad[at] ^= 0x10;
    spit(path, bad);
    AMPP_EXPECT_THROW_WITH(read_checkpoint_bytes(path.string()), "corrupted");
  }
  spit(path, good + "junk");
  AMPP_EXPECT_THROW_WITH(read_checkpoint_bytes(path.string()), "unexpected bytes");
  spit(path, "PK\x03\x04 this is a zip file, not ours");
  AMPP_EXPECT_THROW_WITH(read_checkpoint_bytes(path.string()), "not an ampp checkpoint");
  AMPP_EXPECT_THROW_WITH(read_checkpoint_bytes((tmp.path() / "missing").string()), "does not exist");
}

TEST(Checkpoint, ValidContainerWithGarbagePayloadIsAClearError) {
  ampp_test::TempDir tmp;
  const auto path = (tmp.path() / "c").string();
  write_checkpoint_bytes(path, "not a torch archive");
  torch::serialize::InputArchive in;
  AMPP_EXPECT_THROW_WITH(load_checkpoint(in, path), "the archive inside cannot be read");
}

TEST(Checkpoint, ProcessKilledDuringSaveLeavesThePreviousCheckpointLoadable) {
  ampp_test::TempDir tmp;
  const auto path = (tmp.path() / "ckpt").string();
  const std::string previous(4096, 'p');
  write_checkpoint_bytes(path, previous);
  const std::string big(512u << 20, 'n');  // 512 MiB: the save takes long enough to be interrupted
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    write_checkpoint_bytes(path, big);
    _exit(0);
  }
  // Kill once the temporary file exists and is partly written.
  const fs::path tmpfile = path + ".tmp." + std::to_string(child);
  for (int i = 0; i < 2000 && !(fs::exists(tmpfile) && fs::file_size(tmpfile) > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child finished its save before it could be killed";
  EXPECT_EQ(read_checkpoint_bytes(path), previous);
}

TEST(Checkpoint, RngStateRoundTrip) {
  torch::manual_seed(5);
  auto state = get_rng_state();
  auto a = torch::rand({4});
  set_rng_state(state);
  auto b = torch::rand({4});
  EXPECT_TRUE(torch::equal(a, b));
}

// Before: a checkpoint with a valid CRC and global_step -1 matched the test-only kill hook's "off"
// value, and the process SIGKILLed itself with no message.
TEST(Checkpoint, AnImpossiblePositionIsAClearError) {
  ampp_test::TempDir tmp;
  auto model = torch::nn::Linear(2, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  ampp::Amp amp = ampp::initialize(model, sgd);
  ampp::dist::DistributedSampler sampler(8, ampp::dist::DistributedSamplerOptions().num_replicas(1).rank(0));
  const TrainingObjects objects{*model, sgd, amp, sampler};
  // With AMPP_WRITE_CORPUS=<folder>: also the seeds of tests/fuzz/fuzz_ampp_checkpoint.cpp (a first
  // byte of 1 there means "a whole file").
  const char* corpus = std::getenv("AMPP_WRITE_CORPUS");
  for (const int64_t step : {int64_t{-1}, int64_t{5}, int64_t{7}}) {
    RunPosition position;
    position.global_step = step;
    position.skipped_total = 6;  // more than 5 steps taken: impossible too
    const fs::path path = tmp.path() / "checkpoint.ampp";
    save_training_checkpoint(path.string(), objects, position);
    if (corpus != nullptr) {
      std::ifstream in(path, std::ios::binary);
      spit(fs::path(corpus) / ("step_" + std::to_string(step) + ".ampp"),
           "\x01" + std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
    }
    if (step == 7) EXPECT_EQ(TrainingCheckpoint(path.string()).position().global_step, 7);
    if (step != 7) AMPP_EXPECT_THROW_WITH(TrainingCheckpoint{path.string()}, "its position is impossible");
  }
}

// Found by tests/fuzz/fuzz_ampp_checkpoint (corpus/ampp_checkpoint/miniz_init_leak.ampp) when LibTorch's
// zip reader read the payload (and leaked 152 bytes refusing it): ampp's reader refuses it, in one line
// naming the checkpoint.
TEST(Checkpoint, APayloadThatIsNotAZipIsOneLine) {
  ampp_test::TempDir tmp;
  std::ifstream in(std::string(AMPP_FUZZ_CORPUS_DIR) + "/ampp_checkpoint/miniz_init_leak.ampp", std::ios::binary);
  ASSERT_TRUE(in);
  const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(seed[0] % 2, 0) << "an even first byte: the rest is the payload (fuzz_ampp_checkpoint.cpp)";
  const fs::path path = tmp.path() / "checkpoint.ampp";
  spit(path, checkpoint_file_bytes(seed.substr(1)));
  const std::string message = ampp_test::error_of([&] { TrainingCheckpoint{path.string()}; });
  EXPECT_THAT(message, ::testing::HasSubstr("passed its checksum but the archive inside cannot be read (no zip"));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}
