// libFuzzer harness: ampp::train::read_idx on arbitrary bytes (a dataset file, gzip or plain).
#include <ampp/train/idx_file.h>

#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_input(data, size, ".idx");
  try {
    fuzz::touch_storage(ampp::train::read_idx(path));
  } catch (const c10::Error&) {
  }
  return 0;
}
