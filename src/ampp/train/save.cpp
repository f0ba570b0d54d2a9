// One-call checkpoints of a user's loop (save.h): each entry's state in a str-keyed dict, written and read
// with ampp's PyTorch-format files (io/pytorch_checkpoint.h).
#include <ampp/dist/process_group.h>
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/train/save.h>

#include <torch/torch.h>

#include <limits>

namespace ampp {
namespace {

using Functions = std::pair<CheckpointEntry::Save, CheckpointEntry::Load>;

// An object with state_dict() and load_state_dict(StateDict): GradScaler, Amp.
template <class T>
Functions state_dict_of(T& object) {
  return {[&object] { return c10::IValue(object.state_dict()); },
          [&object](const c10::IValue& state) { object.load_state_dict(to_state_dict(state, "the entry")); }};
}

// A variable of type T: saved as it is; loaded when the file's value has the type `has_type` accepts.
template <class T>
Functions variable(T& value, bool (c10::IValue::*has_type)() const, const char* type) {
  return {[&value] { return c10::IValue(value); },
          [&value, has_type, type](const c10::IValue& state) {
            TORCH_CHECK((state.*has_type)(), "must be a ", type, ", got ", state.tagKind());
            value = state.to<T>();
          }};
}

bool writes_here() { return !dist::is_initialized() || dist::default_group().rank() == 0; }

}  // namespace

CheckpointEntry::CheckpointEntry(torch::nn::Module& module)
    : CheckpointEntry(Functions{[&module] { return c10::IValue(module_state_dict(module)); },
                                [&module](const c10::IValue& state) {
                                  torch::NoGradGuard no_grad;
                                  load_module_state_dict(module, state);  // strict, as PyTorch's default
                                }}) {}

CheckpointEntry::CheckpointEntry(torch::optim::Optimizer& optimizer)
    : CheckpointEntry(
          Functions{[&optimizer] { return c10::IValue(optimizer_state_dict(optimizer)); },
                    [&optimizer](const c10::IValue& state) { load_optimizer_state_dict(optimizer, state); }}) {}

CheckpointEntry::CheckpointEntry(GradScaler& scaler) : CheckpointEntry(state_dict_of(scaler)) {}
CheckpointEntry::CheckpointEntry(Amp& amp) : CheckpointEntry(state_dict_of(amp)) {}

CheckpointEntry::CheckpointEntry(StateDict& dict)
    : CheckpointEntry(Functions{[&dict] { return c10::IValue(dict); },
                                [&dict](const c10::IValue& state) { dict = to_state_dict(state, "the entry"); }}) {}

CheckpointEntry::CheckpointEntry(torch::Tensor& value)
    : CheckpointEntry(Functions{[&value] { return c10::IValue(value.defined() ? value.detach().cpu() : value); },
                                [&value](const c10::IValue& state) {
                                  TORCH_CHECK(state.isTensor(), "must be a tensor, got ", state.tagKind());
                                  value = state.toTensor().to(value.defined() ? value.device() : torch::kCPU);
                                }}) {}

CheckpointEntry::CheckpointEntry(int64_t& value) : CheckpointEntry(variable(value, &c10::IValue::isInt, "int")) {}
CheckpointEntry::CheckpointEntry(double& value) : CheckpointEntry(variable(value, &c10::IValue::isDouble, "float")) {}
CheckpointEntry::CheckpointEntry(bool& value) : CheckpointEntry(variable(value, &c10::IValue::isBool, "bool")) {}
CheckpointEntry::CheckpointEntry(std::string& value)
    : CheckpointEntry(variable(value, &c10::IValue::isString, "str")) {}

// An int is saved as Python's int (64 bits) and must fit back.
CheckpointEntry::CheckpointEntry(int& value)
    : CheckpointEntry(Functions{[&value] { return c10::IValue(int64_t{value}); },
                                [&value](const c10::IValue& state) {
                                  TORCH_CHECK(state.isInt(), "must be an int, got ", state.tagKind());
                                  const int64_t v = state.toInt();
                                  TORCH_CHECK(
                                      v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(), v,
                                      " does not fit the int it is loaded into");
                                  value = static_cast<int>(v);
                                }}) {}

void save(const std::string& path, CheckpointEntries entries) {
  StateDict dict;
  for (const auto& [name, entry] : entries) {
    TORCH_CHECK(!name.empty(), "ampp::save('", path, "'): an entry has an empty name");
    TORCH_CHECK(!dict.contains(name), "ampp::save('", path, "'): two entries are named \"", name, "\"");
    dict.insert(name, entry.state());
  }
  if (writes_here()) save_pytorch(dict, path);
}

void load(const std::string& path, CheckpointEntries entries) {
  const c10::IValue read = load_pytorch(path);
  TORCH_CHECK(read.isGenericDict(), "ampp::load('", path, "'): the file holds a ", read.tagKind(),
              ", not the dict of named entries that ampp::save and torch.save({...}) write");
  StateDict file;
  try {
    file = to_state_dict(read, "the file");
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "ampp::load('", path, "'): ", e.what_without_backtrace());
  }
  std::vector<std::string> missing, present;
  for (const auto& [name, entry] : entries)
    if (!file.contains(name)) missing.push_back("\"" + name + "\"");
  for (const auto& item : file) present.push_back("\"" + item.key() + "\"");
  if (present.size() > 8) present.resize(8), present.emplace_back("...");  // a bare state_dict has hundreds
  TORCH_CHECK(missing.empty(), "ampp::load('", path, "'): the file has no ", c10::Join(", ", missing), "; it holds ",
              c10::Join(", ", present));
  for (const auto& [name, entry] : entries) {
    try {
      entry.load(file.at(name));
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "ampp::load('", path, "'): \"", name, "\": ", e.what_without_backtrace());
    }
  }
}

}  // namespace ampp
