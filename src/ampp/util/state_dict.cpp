#include <ampp/util/state_dict.h>

namespace ampp {

// c10::Dict<std::string, IValue> has no default constructor because an IValue's static type says nothing
// of what the dict will hold; a state dict's values are Any, which is what Python's dicts are.
StateDict::StateDict()
    : dict_(c10::impl::toTypedDict<std::string, c10::IValue>(
          c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()))) {}

StateDict::StateDict(std::initializer_list<Entry> entries) : StateDict() {
  for (const auto& [key, value] : entries) dict_.insert_or_assign(key, value);
}

}  // namespace ampp
