#pragma once
// ampp's one state-dict type: a str-keyed dict of any values, what Python's state_dict() and the dict of
// a checkpoint are. It is an IValue's dict, so it nests in other state dicts and pickles as it is.
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <initializer_list>
#include <string>
#include <utility>

namespace ampp {

using StateDict = c10::Dict<std::string, c10::IValue>;

/// A StateDict holding `entries` in their order (c10::Dict has no default constructor for IValue values,
/// whose runtime type is Any): make_state_dict({{"scale", 512.0}, {"_growth_tracker", int64_t{1}}}).
inline StateDict make_state_dict(std::initializer_list<std::pair<std::string, c10::IValue>> entries = {}) {
  auto dict = c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  for (const auto& [key, value] : entries) dict.insert_or_assign(key, value);
  return dict;
}

}  // namespace ampp
