// libFuzzer harness: ampp::load_pytorch on arbitrary bytes (a torch.save file from outside). Any
// outcome but a value or a c10::Error (one line) is a finding. scripts/fuzz.sh runs it.
#include <ampp/io/pytorch_checkpoint.h>

#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_input(data, size, ".pt");
  try {
    fuzz::touch_all(ampp::load_pytorch(path));
  } catch (const c10::Error& e) {
    if (std::string(e.what_without_backtrace()).find('\n') != std::string::npos) std::abort();  // one line
  }
  return 0;
}
