#pragma once
// What the libFuzzer harnesses share: the readers under test take a path, so each input is written
// to this process's own file first; and every byte of a loaded tensor's storage is read here, in
// instrumented code, so that AddressSanitizer sees a storage that claims more bytes than were
// allocated for it (LibTorch's own reads are not instrumented).
#include <ampp/util/for_each_tensor.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace fuzz {

// This process's input file, removed when the fuzzer exits normally.
struct InputFile {
  std::string path;
  ~InputFile() { std::remove(path.c_str()); }
};

inline std::string write_input(const uint8_t* data, size_t size, const char* suffix) {
  static const InputFile file{
      (std::filesystem::temp_directory_path() / ("ampp-fuzz-" + std::to_string(::getpid()) + suffix)).string()};
  std::FILE* f = std::fopen(file.path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return file.path;
}

inline void touch_storage(const torch::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.storage().data() == nullptr) return;
  const auto* bytes = static_cast<const volatile uint8_t*>(t.storage().data());
  uint8_t sum = 0;
  for (size_t i = 0; i < t.storage().nbytes(); ++i) sum ^= bytes[i];
  (void)sum;
}

inline void touch_all(const c10::IValue& value) { ampp::for_each_tensor(value, touch_storage); }

}  // namespace fuzz
