#pragma once
// ampp's one state-dict type: a str-keyed dict of any values, what Python's state_dict() and the dict of
// a checkpoint are. It is an IValue's dict, so it nests in other state dicts and pickles as it is.
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <string>

namespace ampp {

using StateDict = c10::Dict<std::string, c10::IValue>;

/// An empty StateDict (c10::Dict has no default constructor for IValue values: its value type is Any).
inline StateDict make_state_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

}  // namespace ampp
