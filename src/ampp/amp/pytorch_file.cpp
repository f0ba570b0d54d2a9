// torch.save files (pytorch_checkpoint.h): written with LibTorch's pickler and zip writer; read from
// untrusted bytes through ampp's zip reader (zip_records.h), the pickle guard (pickle_guard.h), then
// LibTorch's unpickler, and every tensor checked against its record before anything reads it.
#include <ampp/amp/pytorch_checkpoint.h>
#include <ampp/util/atomic_file.h>
#include <ampp/util/for_each_tensor.h>
#include <ampp/util/parse_number.h>

#include "ordered_dict_pickle.h"
#include "pickle_guard.h"
#include "zip_records.h"

#include <ATen/EmptyTensor.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ampp {

void save_pytorch(const c10::IValue& object, const std::string& path) {
  std::vector<char> pickled;
  // tag_aggregates = false: no torch.jit._pickle.restore_type_tag calls, which Python's weights_only
  // unpickler refuses; plain dicts and lists, as torch.save writes them.
  torch::jit::Pickler pickler([&](const char* bytes, size_t n) { pickled.insert(pickled.end(), bytes, bytes + n); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(object);
  pickler.stop();
  std::string container;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t n) {
    container.append(static_cast<const char*>(bytes), n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  write_file_atomic(path, container);
}

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

c10::IValue unpickle_checked(detail::ZipRecords& zip) {
  const std::string original = zip.read_string("data.pkl");
  detail::check_pickle(original);
  // What torch::pickle_load does, with the pickle passed through plain_dicts() first, so that a
  // module's state_dict() (an OrderedDict) loads (ordered_dict_pickle.h).
  const std::string pickle = detail::plain_dicts(original);
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
  torch::jit::ObjLoader no_objects = nullptr;
  // map_location="cpu": the unpickler would otherwise copy a "cuda" storage to the GPU before
  // check_tensor() has compared its size with its record.
  torch::jit::Unpickler unpickler(read, nullptr, no_objects, read_record, at::Device(at::kCPU));
  const std::string version_record = zip.contains(".data/version") ? ".data/version" : "version";
  if (zip.contains(version_record)) {
    std::string text = zip.read_string(version_record);
    text.erase(std::find_if(text.rbegin(), text.rend(), [](char c) { return !std::isspace(c); }).base(), text.end());
    const auto version = parse_int(text);
    TORCH_CHECK(version && *version >= 1 && *version <= 100, "record '", version_record, "' is not a format version");
    unpickler.set_version(*version);
  }
  c10::IValue value = detail::without_metadata(unpickler.parse_ivalue());
  for_each_tensor(value, [&records](const torch::Tensor& t) { check_tensor(t, records); });
  return value;
}

}  // namespace

c10::IValue load_pytorch(const std::string& path) {
  {
    std::ifstream in(path, std::ios::binary);
    TORCH_CHECK(in, "cannot open '", path, "' to read a PyTorch checkpoint");
    char magic[2] = {};
    in.read(magic, 2);
    TORCH_CHECK(in && magic[0] == 'P' && magic[1] == 'K', "'", path,
                "' is not a zip-format torch.save file (what PyTorch >= 1.6 writes); re-save it in Python with "
                "torch.save(obj, path)");
  }
  try {
    detail::ZipRecords zip(path);
    return unpickle_checked(zip);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    TORCH_CHECK(false, "cannot read '", path, "' as a torch.save file: ", what.substr(0, what.find('\n')));
  } catch (const std::exception& e) {  // std::bad_alloc and the like, from sizes the checks above allowed
    TORCH_CHECK(false, "cannot read '", path, "' as a torch.save file: ", e.what());
  }
}

}  // namespace ampp
