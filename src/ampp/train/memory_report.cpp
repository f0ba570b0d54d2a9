#include <ampp/train/memory_report.h>
#include <ampp/train/metrics.h>
#include <ampp/util/optimizer_compat.h>
#include <c10/util/Type.h>
#include <fmt/format.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <limits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "report_json.h"

namespace ampp::train {
namespace {

// Adds the bytes of each tensor's storage not counted yet (by any kind) to `into`.
class StorageCounter {
 public:
  void add(const torch::Tensor& t, int64_t& into) {
    if (!t.defined() || !t.has_storage()) return;
    const void* key = t.storage().unsafeGetStorageImpl();
    if (seen_.insert(key).second) into += static_cast<int64_t>(t.storage().nbytes());
  }
  template <typename Tensors>
  void add_all(const Tensors& tensors, int64_t& into) {
    for (const auto& t : tensors) add(t, into);
  }

 private:
  std::unordered_set<const void*> seen_;
};

std::vector<torch::Tensor> stepped_parameters(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups())
    params.insert(params.end(), group.params().begin(), group.params().end());
  return params;
}

std::vector<torch::Tensor> state_tensors(torch::optim::Optimizer& owner) {
  std::vector<torch::Tensor> tensors;
  for (auto& entry : owner.state()) {
    auto& state = *entry.second;
    const bool known = for_each_state_tensor(state, [&](torch::Tensor& t) { tensors.push_back(t); });
    TORCH_CHECK(known, "ampp::train::measure_memory: cannot read optimizer state of type ",
                c10::demangle(typeid(state).name()), "; SGD, Adam, AdamW, RMSprop and Adagrad are known");
  }
  return tensors;
}

std::vector<torch::Tensor> gradients(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  return grads;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// RssFile from /proc/self/status (Linux); 0 where it cannot be read.
int64_t resident_file_pages() {
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t kib = 0;
  while (status >> key) {
    if (key == "RssFile:" && status >> kib) return kib * 1024;
    status.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

// The resident bytes of the mapping that holds `address`, from /proc/self/smaps (Linux); 0 if not found.
int64_t resident_bytes_of_mapping(const void* address) {
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &begin, &end) == 2 && line.find(':') > line.find(' ')) {
      inside = begin <= target && target < end;
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      return std::stoll(line.substr(4)) * 1024;
    }
  }
  return 0;
}

}  // namespace

MemoryReport measure_memory(const torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                            torch::optim::Optimizer& state_owner, const std::vector<torch::Tensor>& gradient_buffers,
                            const DatasetPair& data, const TensorMemoryTracker& tracker) {
  MemoryReport r;
  StorageCounter counter;  // in this order: a master that is the model's own parameter counts as a weight
  const auto model_params = model.parameters(), stepped = stepped_parameters(optimizer);
  counter.add_all(model_params, r.weights);
  counter.add_all(model.buffers(), r.weights);
  counter.add_all(stepped, r.masters);
  counter.add_all(gradients(model_params), r.gradients);
  counter.add_all(gradients(stepped), r.gradients);
  counter.add_all(gradient_buffers, r.gradients);
  counter.add_all(state_tensors(state_owner), r.optimizer_state);
  for (const Dataset* d : {&data.train, &data.test}) {
    if (d->images_file.empty())
      counter.add(d->images, r.data);
    else if (d->images.defined())
      r.mapped_data += resident_bytes_of_mapping(d->images.data_ptr());
    counter.add(d->labels, r.data);
  }
  r.tensors_at_rest = tracker.current();
  const int64_t named = r.weights + r.masters + r.gradients + r.optimizer_state + r.data;
  r.other_tensors = std::max<int64_t>(0, r.tensors_at_rest - named);  // negative: named tensors from before the tracker
  r.tensor_peak = tracker.peak();
  r.process_peak = static_cast<int64_t>(peak_rss_mb() * (1 << 20));
  r.file_backed = resident_file_pages();
  return r;
}

// The JSON names of the report's fields, one list for writing and reading. `optional`: summaries written
// before the field existed lack it (read as 0); every other field must be there.
struct JsonField {
  const char* name;
  int64_t MemoryReport::* field;
  bool optional;
};
constexpr JsonField kJsonFields[] = {{"weights", &MemoryReport::weights, false},
                                     {"masters", &MemoryReport::masters, false},
                                     {"gradients", &MemoryReport::gradients, false},
                                     {"optimizer_state", &MemoryReport::optimizer_state, false},
                                     {"data", &MemoryReport::data, false},
                                     {"mapped_data", &MemoryReport::mapped_data, true},
                                     {"other_tensors", &MemoryReport::other_tensors, false},
                                     {"tensors_at_rest", &MemoryReport::tensors_at_rest, false},
                                     {"tensor_peak", &MemoryReport::tensor_peak, false},
                                     {"process_peak", &MemoryReport::process_peak, false},
                                     {"file_backed", &MemoryReport::file_backed, false}};

nlohmann::json to_json(const MemoryReport& r) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, field, optional] : kJsonFields) j[name] = r.*field;
  return j;
}

MemoryReport memory_report_from_json(const nlohmann::json& j) {
  MemoryReport r;
  for (const auto& [name, field, optional] : kJsonFields) {
    if (!optional || j.contains(name)) r.*field = j.at(name).get<int64_t>();
  }
  return r;
}

std::string memory_table(const MemoryReport& r) {
  std::string out = fmt::format("{:<46} {:>9} {:>8}\n", "memory (rank 0)", "MiB", "of peak");
  auto row = [&](const char* name, int64_t bytes) {
    const double share = r.process_peak > 0 ? 100.0 * static_cast<double>(bytes) / r.process_peak : 0.0;
    out += fmt::format("{:<46} {:>9.2f} {:>7.1f}%\n", name, mib(bytes), share);
  };
  row("weights (parameters, buffers)", r.weights);
  row("FP32 masters", r.masters);
  row("gradients", r.gradients);
  row("optimizer state", r.optimizer_state);
  row("data in memory", r.data);
  row("data mapped from files (resident, shared)", r.mapped_data);
  row("other tensors", r.other_tensors);
  row("activations and temporaries (peak)", r.activations_and_temporaries());
  row("libraries' code (resident)", r.library_code());
  row("other (runtime heap, slack, kernels' scratch)", r.other_anonymous());
  row("process peak (RSS)", r.process_peak);
  return out;
}

}  // namespace ampp::train
