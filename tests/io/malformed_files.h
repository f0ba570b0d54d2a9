#pragma once
// Malformed torch.save files rebuilt from the descriptions of issue 27's reproductions, for the tests
// (untrusted_checkpoint_test.cpp) and as the fuzzers' seed corpus (tests/fuzz/corpus/pt, written by
// that test when AMPP_WRITE_CORPUS names a folder). Each is a whole file's bytes.
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "io/rewritten_archive.h"

namespace malformed {

// A zip written by PyTorch's own writer (valid CRCs), holding `pickle` as data.pkl and `records` as data/<key>.
inline std::string archive(const std::string& pickle, const std::map<std::string, std::string>& records) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t n) {
    out.append(static_cast<const char*>(bytes), n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  for (const auto& [key, bytes] : records) writer.writeRecord("data/" + key, bytes.data(), bytes.size());
  writer.writeEndOfFile();
  return out;
}

// The pickle of {name: tensor} as torch.save writes it, and the tensor's record bytes.
inline std::pair<std::string, std::string> pickled_tensor(const std::string& name, const torch::Tensor& t) {
  std::string pickle;
  torch::jit::Pickler pickler([&](const char* b, size_t n) { pickle.append(b, n); }, nullptr, nullptr, nullptr, nullptr,
                              /*tag_aggregates=*/false);
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert(name, t);
  pickler.protocol();
  pickler.pushIValue(d);
  pickler.stop();
  const auto data = torch::jit::getWriteableTensorData(pickler.tensorData().at(0));
  return {pickle, std::string(static_cast<const char*>(data.data()), data.sizeInBytes())};
}

// fc1.weight of the mlp: 256 x 784 float32, 802,816 bytes.
inline torch::Tensor fc1_weight() { return torch::arange(256 * 784, torch::kFloat).reshape({256, 784}) / 1000; }

// 1. The tensor record shorter than the pickle declares: empty, or 16 bytes.
inline std::string short_record(size_t bytes) {
  const auto [pickle, data] = pickled_tensor("fc1.weight", fc1_weight());
  return archive(pickle, {{"0", data.substr(0, bytes)}});
}

// 2. Nesting `depth` deep: lists (EMPTY_LIST x depth, APPEND x depth-1) or tuples (EMPTY_TUPLE, TUPLE1
//    x depth: the unpickler's stack never holds more than one object).
inline std::string deep_pickle(size_t depth, bool tuples) {
  std::string p = "\x80\x02";
  if (tuples) {
    p += ")";
    p += std::string(depth, '\x85');
  } else {
    p += std::string(depth, ']');
    p += std::string(depth - 1, 'a');
  }
  return p + ".";
}
inline std::string deep_nesting(size_t depth, bool tuples) { return archive(deep_pickle(depth, tuples), {}); }

// 3. One bit flipped inside the tensor's record.
inline std::string flipped_bit(size_t byte, int bit) {
  const auto [pickle, data] = pickled_tensor("fc1.weight", fc1_weight());
  std::string flipped = data;
  flipped[byte % flipped.size()] ^= static_cast<char>(1 << bit);
  std::string file = archive(pickle, {{"0", data}});
  const size_t at = file.find(data);  // the record is stored as it is
  file.replace(at, data.size(), flipped);
  return file;
}

// A memo index of 2^32 - 16 (LONG_BINPUT): the unpickler would reserve a memo that large.
inline std::string huge_memo_index() { return archive(std::string("\x80\x02]r\xf0\xff\xff\xff.", 9), {}); }

// A list that contains itself (EMPTY_LIST, BINPUT 0, BINGET 0, APPEND).
inline std::string self_containing_list() {
  return archive(std::string("\x80\x02]q\x00"
                             "h\x00"
                             "a.",
                             9),
                 {});
}

// A global outside what a state dict needs.
inline std::string foreign_global() { return archive("\x80\x02\x63os\nsystem\n)R.", {}); }

// The tensor's storage saved from "cuda:0" (its location string replaced).
inline std::string cuda_location() {
  auto [pickle, data] = pickled_tensor("fc1.weight", fc1_weight());
  return archive(ampp_test::with_first_storage_on_cuda0(pickle), {{"0", data}});
}

// Every file above with its corpus name.
inline std::vector<std::pair<std::string, std::string>> all() {
  return {{"short_record_empty.pt", short_record(0)},
          {"short_record_16.pt", short_record(16)},
          {"deep_list_200k.pt", deep_nesting(200000, false)},
          {"deep_tuple_100k.pt", deep_nesting(100000, true)},
          {"flipped_bit.pt", flipped_bit(1000, 3)},
          {"huge_memo_index.pt", huge_memo_index()},
          {"self_containing_list.pt", self_containing_list()},
          {"foreign_global.pt", foreign_global()},
          {"cuda_location.pt", cuda_location()}};
}

}  // namespace malformed
