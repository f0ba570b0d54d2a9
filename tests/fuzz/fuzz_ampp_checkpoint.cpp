// libFuzzer harness: an ampp checkpoint (checkpoint.ampp) on arbitrary bytes. Half the inputs (first
// byte even) are taken as the payload and given a valid header and CRC, so that the fuzzer reaches
// the archive inside rather than stopping at the checksum; the others are read as whole files.
#include <ampp/train/checkpoint.h>

#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) file = ampp::train::checkpoint_file_bytes(file);
  const std::string path = fuzz::write_input(reinterpret_cast<const uint8_t*>(file.data()), file.size(), ".ampp");
  try {
    ampp::train::TrainingCheckpoint checkpoint(path);
    (void)checkpoint.position();
  } catch (const c10::Error&) {
  }
  return 0;
}
