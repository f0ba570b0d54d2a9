// torch::serialize archives from outside are untrusted: read_archive() loads what OutputArchive wrote,
// exactly, without compiling the archive's TorchScript, and refuses what the pickle guard refuses.
#include <ampp/io/archive_reader.h>
#include <ampp/util/archive_bytes.h>

#include "ampp_test.h"
#include "io/rewritten_archive.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <string>

namespace {

using ampp_test::rewritten;
using ::testing::HasSubstr;

// An archive with what ampp's checkpoints hold: parameters, buffers, nested archives, numbers, strings and
// typed lists.
std::string sample_archive() {
  torch::serialize::OutputArchive root, nested;
  root.write("weight", torch::arange(6, torch::kFloat).reshape({2, 3}));
  root.write("running_mean", torch::full({3}, 0.5), /*is_buffer=*/true);
  root.write("step", c10::IValue(int64_t{42}));
  root.write("scale", c10::IValue(65536.0));
  root.write("name", c10::IValue(std::string("gpt-small")));
  nested.write("masters", c10::IValue(c10::List<at::Tensor>({torch::ones({2}), torch::zeros({3}, torch::kDouble)})));
  nested.write("rng", torch::arange(8, torch::kByte));
  root.write("amp", nested);
  return ampp::archive_bytes(root);
}

// sample_archive() with its first storage's location "cpu" rewritten to "cuda:0", as rank 0 of a GPU run saves
// it (the others refer to that storage's location by memo).
std::string saved_on_cuda0() {
  return rewritten(sample_archive(), [](const std::string& name, std::string content) {
    return name == "data.pkl" ? ampp_test::with_first_storage_on_cuda0(std::move(content)) : content;
  });
}

std::string read_error(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  return ampp_test::error_of([&] { ampp::read_archive(archive, bytes); });
}

}  // namespace

TEST(ArchiveReader, ReadsWhatOutputArchiveWroteExactly) {
  torch::serialize::InputArchive in;
  ampp::read_archive(in, sample_archive());
  torch::Tensor weight, mean;
  in.read("weight", weight);
  in.read("running_mean", mean, /*is_buffer=*/true);
  EXPECT_TRUE(torch::equal(weight, torch::arange(6, torch::kFloat).reshape({2, 3})));
  EXPECT_TRUE(torch::equal(mean, torch::full({3}, 0.5)));
  c10::IValue step, scale, name;
  in.read("step", step);
  in.read("scale", scale);
  in.read("name", name);
  EXPECT_EQ(step.toInt(), 42);
  EXPECT_EQ(scale.toDouble(), 65536.0);
  EXPECT_EQ(name.toStringRef(), "gpt-small");
  torch::serialize::InputArchive amp;
  in.read("amp", amp);
  c10::IValue masters;
  amp.read("masters", masters);
  ASSERT_EQ(masters.toTensorList().size(), 2u);
  EXPECT_TRUE(torch::equal(masters.toTensorList().get(1), torch::zeros({3}, torch::kDouble)));
  torch::Tensor rng;
  amp.read("rng", rng);
  EXPECT_TRUE(torch::equal(rng, torch::arange(8, torch::kByte)));
  // Parameters and buffers read as LibTorch's own loader reads them, either way round.
  const std::string bytes = sample_archive();
  torch::serialize::InputArchive libtorch;
  libtorch.load_from(bytes.data(), bytes.size());
  for (const std::string key : {"weight", "running_mean"})
    for (const bool is_buffer : {false, true}) {
      torch::Tensor ours, theirs;
      const std::string our_error = ampp_test::error_of([&] { in.read(key, ours, is_buffer); });
      const std::string their_error = ampp_test::error_of([&] { libtorch.read(key, theirs, is_buffer); });
      EXPECT_EQ(our_error.empty(), their_error.empty()) << key << " " << is_buffer << ": " << our_error;
      if (our_error.empty() && their_error.empty()) EXPECT_TRUE(torch::equal(ours, theirs));
    }
}

TEST(ArchiveReader, NeverCompilesTheArchivesCode) {
  // Code that LibTorch's loader compiles and rejects: read_archive() reads only the declarations.
  const std::string bytes = rewritten(sample_archive(), [](const std::string& name, std::string content) {
    if (name == "code/__torch__.py") content += "  def forward(self) -> Tensor:\n    return undefined_name(\n";
    return content;
  });
  torch::serialize::InputArchive libtorch;
  EXPECT_FALSE(ampp_test::error_of([&] { libtorch.load_from(bytes.data(), bytes.size()); }).empty());
  torch::serialize::InputArchive in;
  ampp::read_archive(in, bytes);
  c10::IValue step;
  in.read("step", step);
  EXPECT_EQ(step.toInt(), 42);
}

TEST(ArchiveReader, AGlobalOtherThanTheArchivesModulesIsRefused) {
  const std::string bytes = rewritten(sample_archive(), [](const std::string& name, std::string content) {
    const std::string module = "c__torch__\nModule\n";
    const size_t at = content.find(module);
    if (name == "data.pkl" && at != std::string::npos) content.replace(at, module.size(), "cos\nsystem\n");
    return content;
  });
  EXPECT_THAT(read_error(bytes), HasSubstr("the pickle calls os.system, which ampp does not load"));
}

TEST(ArchiveReader, AModuleClassWithoutADeclarationIsRefused) {
  const std::string bytes = rewritten(sample_archive(), [](const std::string& name, std::string content) {
    return name == "code/__torch__.py" ? std::string("# nothing declared here\n") : content;
  });
  EXPECT_THAT(read_error(bytes),
              HasSubstr("data.pkl builds a '__torch__.Module', which is neither a container type nor a "
                        "module class the archive declares in code/"));
}

// An attribute's name is written into the code LibTorch's exporter generates: one that could end its
// string or line there is refused.
TEST(ArchiveReader, AnAttributeNameThatCouldBreakOutOfTheGeneratedCodeIsRefused) {
  const std::string bytes = rewritten(sample_archive(), [](const std::string& name, std::string content) {
    const size_t at = content.find("weight");
    if (name == "data.pkl" && at != std::string::npos) content.replace(at, 6, "we\"\nht");
    return content;
  });
  EXPECT_THAT(read_error(bytes), HasSubstr("has an attribute named 'we\"?ht': names are letters, digits and"));
}

TEST(ArchiveReader, AParameterThatIsNotATensorIsRefused) {
  const std::string bytes = rewritten(sample_archive(), [](const std::string& name, std::string content) {
    const std::string list = "__parameters__ = [";
    const size_t at = content.find(list);
    if (name == "code/__torch__.py" && at != std::string::npos) content.insert(at + list.size(), "\"step\", ");
    return content;
  });
  EXPECT_THAT(read_error(bytes), HasSubstr("declares 'step' a parameter or buffer, but it holds a Int"));
}

// Storages return to the device they were saved on, once checked on the CPU; where that device is missing,
// the error names the record and the device.
TEST(ArchiveReader, StoragesGoBackToTheDeviceTheyWereSavedOn) {
  const std::string bytes = saved_on_cuda0();
  if (torch::cuda::is_available()) {
    torch::serialize::InputArchive in;
    ampp::read_archive(in, bytes);
    torch::Tensor weight;
    in.read("weight", weight);
    EXPECT_TRUE(weight.is_cuda());
    EXPECT_TRUE(torch::equal(weight.cpu(), torch::arange(6, torch::kFloat).reshape({2, 3})));
    return;
  }
  const std::string message = read_error(bytes);
  EXPECT_THAT(message, HasSubstr("was saved on cuda:0, which this process cannot use ("));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// map_location (issue 52, defect 5): every rank of a one-GPU-per-rank run loads a checkpoint rank 0 saved on
// cuda:0 onto its own device. Here a "cuda:0" storage loads onto the CPU, which holds on a machine without a
// GPU too; the GPU suite's run of this test also loads it onto the GPU it names.
TEST(ArchiveReader, AMapLocationLoadsEveryStorageThereWhereverItWasSaved) {
  const std::string bytes = saved_on_cuda0();
  std::vector<torch::Device> targets{torch::kCPU};
  if (torch::cuda::is_available()) targets.emplace_back(torch::kCUDA, 0);
  for (const auto& device : targets) {
    torch::serialize::InputArchive in;
    ampp::read_archive(in, bytes, device);
    torch::Tensor weight, mean;
    in.read("weight", weight);
    in.read("running_mean", mean, /*is_buffer=*/true);
    EXPECT_EQ(weight.device(), device);
    EXPECT_EQ(mean.device(), device);
    EXPECT_TRUE(torch::equal(weight.cpu(), torch::arange(6, torch::kFloat).reshape({2, 3})));
  }
}

TEST(ArchiveReader, TruncatedOrCorruptedBytesAreOneLineErrors) {
  const std::string good = sample_archive();
  for (size_t keep : {size_t{0}, size_t{10}, good.size() / 2, good.size() - 1}) {
    const std::string message = read_error(good.substr(0, keep));
    EXPECT_FALSE(message.empty()) << keep;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  std::string flipped = good;
  flipped[good.find("gpt-small")] ^= 1;
  EXPECT_THAT(read_error(flipped), HasSubstr("is corrupted (its CRC-32 does not match"));
}

namespace {

// Whether two values read from archives are the same: tensors by value, containers item by item.
bool same_value(const c10::IValue& a, const c10::IValue& b) {
  if (a.tagKind() != b.tagKind()) return false;
  if (a.isTensor()) return a.toTensor().sizes() == b.toTensor().sizes() && torch::equal(a.toTensor(), b.toTensor());
  if (a.isList()) {
    const auto x = a.toListRef(), y = b.toListRef();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!same_value(x[i], y[i])) return false;
    return true;
  }
  if (a.isGenericDict()) {
    const auto x = a.toGenericDict(), y = b.toGenericDict();
    if (x.size() != y.size()) return false;
    for (const auto& item : x)
      if (!y.contains(item.key()) || !same_value(item.value(), y.at(item.key()))) return false;
    return true;
  }
  if (a.isInt() || a.isDouble() || a.isBool() || a.isString() || a.isNone()) return a == b;
  ADD_FAILURE() << "a value of kind " << a.tagKind() << " in the archive";
  return false;
}

// Every key of `ours` holds what `theirs` (LibTorch's own reading) holds, nested archives too; returns the
// number of values compared.
size_t expect_same_archive(torch::serialize::InputArchive& ours, torch::serialize::InputArchive& theirs,
                           const std::string& where) {
  EXPECT_EQ(ours.keys(), theirs.keys()) << where;
  size_t compared = 0;
  for (const std::string& key : theirs.keys()) {
    torch::serialize::InputArchive our_child, their_child;
    if (theirs.try_read(key, their_child)) {
      EXPECT_TRUE(ours.try_read(key, our_child)) << where << key << " is not a nested archive";
      compared += expect_same_archive(our_child, their_child, where + key + ".");
      continue;
    }
    c10::IValue mine, theirs_value;
    theirs.read(key, theirs_value);
    EXPECT_TRUE(ours.try_read(key, mine)) << where << key;
    EXPECT_TRUE(same_value(mine, theirs_value)) << where << key;
    ++compared;
  }
  return compared;
}

}  // namespace

// A whole training checkpoint that ampp train wrote (the fuzz seed step_7.ampp: model, optimizer, amp,
// sampler and trainer archives) reads as LibTorch's own loader reads it, value for value.
TEST(ArchiveReader, ATrainingCheckpointReadsAsLibTorchReadsIt) {
  std::ifstream in(std::string(AMPP_FUZZ_CORPUS_DIR) + "/ampp_checkpoint/step_7.ampp", std::ios::binary);
  ASSERT_TRUE(in);
  const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(seed.substr(1, 8), "AMPPCKPT") << "a first byte of 1, then a whole checkpoint.ampp";
  const std::string archive = seed.substr(1 + 32);  // past the fuzz flag and the container's header
  torch::serialize::InputArchive ours, theirs;
  ampp::read_archive(ours, archive);
  theirs.load_from(archive.data(), archive.size());
  EXPECT_GT(expect_same_archive(ours, theirs, ""), 10u);
}
