#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Every tensor inside an IValue (tuples, lists, dict keys and values, objects' attributes), visited with an explicit
// stack: no recursion on the value's depth, which may come from an untrusted file.
#include <ATen/core/ivalue.h>

#include <utility>
#include <vector>

namespace ampp {

template <typename Fn>
void for_each_tensor(const c10::IValue& value, Fn&& fn) {
  std::vector<c10::IValue> pending{value};
  while (!pending.empty()) {
    const c10::IValue v = std::move(pending.back());
    pending.pop_back();
    if (v.isTensor()) fn(v.toTensor());
    if (v.isTuple())
      for (const auto& e : v.toTupleRef().elements()) pending.push_back(e);
    if (v.isList())
      for (const auto& e : v.toListRef()) pending.push_back(e);
    if (v.isGenericDict())
      for (const auto& item : v.toGenericDict()) pending.push_back(item.key()), pending.push_back(item.value());
    if (v.isObject())
      for (const auto& slot : v.toObjectRef().slots()) pending.push_back(slot);
  }
}

}  // namespace ampp
