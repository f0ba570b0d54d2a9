#pragma once
// Test helper: an archive's bytes with each record edited, written again by LibTorch's own zip writer, to
// build inputs that LibTorch's loader and ampp's reader take differently (code LibTorch would compile, a
// storage saved on another device, a foreign global).
#include <caffe2/serialize/inline_container.h>

#include <functional>
#include <stdexcept>
#include <string>

#include "ampp/io/zip_records.h"

namespace ampp_test {

// `bytes` with each record passed through `edit(name, content)`.
inline std::string rewritten(const std::string& bytes,
                             const std::function<std::string(const std::string&, std::string)>& edit) {
  auto zip = ampp::detail::ZipRecords::of_bytes(bytes);
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  for (const std::string& name : zip.names()) {
    if (name == "version" || name == ".data/version" || name == ".data/serialization_id" || name == "byteorder")
      continue;  // the writer adds its own
    const std::string content = edit(name, zip.read_string(name));
    writer.writeRecord(name, content.data(), content.size());
  }
  writer.writeEndOfFile();
  return out;
}

// `pickle` with its first storage location, the string "cpu" as the pickler writes it (BINUNICODE), made
// "cuda:0", as rank 0 of a GPU run saves it (a later storage refers to that string by memo). A pickle without
// one is the test's own mistake: it throws.
inline std::string with_first_storage_on_cuda0(std::string pickle) {
  // (split literals: a hex escape would swallow the "c" after it)
  const std::string cpu(
      "X\x03\x00\x00\x00"
      "cpu",
      8),
      cuda(
          "X\x06\x00\x00\x00"
          "cuda:0",
          11);
  const size_t at = pickle.find(cpu);
  if (at == std::string::npos) throw std::logic_error("with_first_storage_on_cuda0: the pickle has no \"cpu\" storage");
  return pickle.replace(at, cpu.size(), cuda);
}

}  // namespace ampp_test
