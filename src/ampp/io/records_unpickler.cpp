// The unpickling both of ampp's readers share (records_unpickler.h): LibTorch's unpickler with storages read
// from the zip's records, then every tensor checked against its record before anything reads it.
#include "records_unpickler.h"

#include <ampp/util/for_each_tensor.h>
#include <ampp/util/parse_number.h>

#include <ATen/EmptyTensor.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <string>
#include <utility>

namespace ampp::detail {
namespace {

// Each storage's tensor record, by the address of the bytes read for it.
using RecordSizes = std::map<const void*, std::pair<std::string, size_t>>;

// A tensor as the unpickler built it is only a view onto a storage whose size the pickle declared: it
// must be dense, on the CPU, inside its storage, and the storage exactly as long as its record (what
// torch.load checks too), or reading it would run past the record's bytes.
void check_tensor(const torch::Tensor& t, const RecordSizes& records) {
  TORCH_CHECK(t.layout() == c10::kStrided && !t.is_quantized() && t.device().is_cpu(),
              "a tensor is sparse, quantized or not on the CPU: only dense tensors are loaded");
  for (int64_t d = 0; d < t.dim(); ++d)
    TORCH_CHECK(t.size(d) >= 0 && t.stride(d) >= 0, "a tensor has a negative size or stride");
  const size_t storage_bytes = t.storage().nbytes();
  const auto record = records.find(t.storage().data());
  if (record == records.end()) {
    TORCH_CHECK(storage_bytes == 0, "a tensor's storage has no record in the archive");
    return;
  }
  const auto& [name, record_bytes] = record->second;
  TORCH_CHECK(record_bytes == storage_bytes, "record 'data/", name, "' holds ", record_bytes,
              " bytes, but the pickle declares a storage of ", storage_bytes, " bytes (truncated or corrupted)");
  if (t.numel() == 0) return;
  const size_t needed = at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.element_size(), t.storage_offset());
  TORCH_CHECK(needed <= storage_bytes, "a tensor of shape ", t.sizes(), " reaches past its storage ('data/", name,
              "')");
}

// Moves every tensor whose storage was saved off the CPU back there, in place (set_data keeps the tensor
// object the containers hold). Each storage moves once, so views of it keep sharing it.
void move_to_saved_devices(const c10::IValue& value, const RecordSizes& records, const StorageLocations& locations) {
  std::map<const void*, at::Tensor> moved;  // the storage's bytes on their device, by CPU address
  for_each_tensor(value, [&](const torch::Tensor& t) {
    const auto record = records.find(t.storage().data());
    if (record == records.end()) return;
    const auto location = locations.find(record->second.first);
    if (location == locations.end() || location->second == "cpu") return;
    auto& bytes = moved[t.storage().data()];
    if (!bytes.defined()) {
      const c10::Device device(location->second);  // a c10::Error naming a malformed location
      const auto cpu = at::empty({static_cast<int64_t>(t.storage().nbytes())}, at::kByte).set_(t.storage());
      try {
        bytes = cpu.to(device);
      } catch (const std::exception& e) {  // c10::Error, or CUDA's own where no driver loads
        const std::string what = e.what();
        TORCH_CHECK(false, "record 'data/", record->second.first, "' was saved on ", location->second,
                    ", which this process cannot use (", what.substr(0, what.find('\n')),
                    "); load it where that device exists");
      }
    }
    t.set_data(at::empty({0}, t.options().device(bytes.device()))
                   .set_(bytes.storage(), t.storage_offset(), t.sizes(), t.strides()));
  });
}

}  // namespace

c10::IValue unpickle_with_records(ZipRecords& zip, const std::string& pickle, UnpickleOptions options) {
  size_t offset = 0;
  auto read = [&](char* buffer, size_t n) {
    n = std::min(n, pickle.size() - offset);
    std::memcpy(buffer, pickle.data() + offset, n);
    offset += n;
    return n;
  };
  RecordSizes records;
  std::function<at::DataPtr(const std::string&)> read_record = [&](const std::string& name) {
    size_t size = 0;
    at::DataPtr data = zip.read("data/" + name, size);
    records[data.get()] = {name, size};
    return data;
  };
  // map_location="cpu": the unpickler would otherwise copy a "cuda" storage to the GPU before
  // check_tensor() has compared its size with its record.
  torch::jit::Unpickler unpickler(read, std::move(options.types), std::move(options.objects), read_record,
                                  at::Device(at::kCPU));
  const std::string version_record = zip.contains(".data/version") ? ".data/version" : "version";
  if (zip.contains(version_record)) {
    std::string text = zip.read_string(version_record);
    text.erase(std::find_if(text.rbegin(), text.rend(), [](char c) { return !std::isspace(c); }).base(), text.end());
    const auto version = parse_int(text);
    TORCH_CHECK(version && *version >= 1 && *version <= 100, "record '", version_record, "' is not a format version");
    unpickler.set_version(*version);
  }
  c10::IValue value = unpickler.parse_ivalue();
  for_each_tensor(value, [&records](const torch::Tensor& t) { check_tensor(t, records); });
  if (options.locations) move_to_saved_devices(value, records, *options.locations);
  return value;
}

}  // namespace ampp::detail
