// torch.save files (pytorch_checkpoint.h): written with LibTorch's pickler and zip writer; read from
// untrusted bytes through ampp's zip reader (zip_records.h), the pickle guard (pickle_guard.h), then
// LibTorch's unpickler, and every tensor checked against its record before anything reads it.
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/util/atomic_file.h>

#include "ordered_dict_pickle.h"
#include "pickle_guard.h"
#include "records_unpickler.h"
#include "zip_records.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <cstring>
#include <fstream>
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

c10::IValue unpickle_checked(detail::ZipRecords& zip) {
  const std::string original = zip.read_string("data.pkl");
  detail::check_pickle(original);
  // What torch::pickle_load does, with the pickle passed through plain_dicts() first, so that a
  // module's state_dict() (an OrderedDict) loads (ordered_dict_pickle.h).
  return detail::without_metadata(detail::unpickle_with_records(zip, detail::plain_dicts(original)));
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
