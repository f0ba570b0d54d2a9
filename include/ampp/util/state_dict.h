#pragma once
// ampp's one state-dict type: a str-keyed dict of any values, what Python's state_dict() and the dict of
// a checkpoint are. It holds an IValue dict (c10::Dict<std::string, IValue>), so it nests in other state
// dicts and pickles as it is; unlike that dict it has a default constructor and a brace initializer:
//
//   ampp::StateDict sd;                                   // empty
//   ampp::StateDict sd{{"scale", 512.0}, {"_growth_tracker", int64_t{1}}};
//   sd.insert_or_assign("epoch", int64_t{3});
//   c10::IValue v = sd;                                   // nests in a dict or a pickled file
//
// Copies share their entries, as c10::Dict's (and Python dicts passed around) do; copy() is a deep one.
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>

namespace ampp {

class StateDict {
 public:
  using Dict = c10::Dict<std::string, c10::IValue>;
  using Entry = std::pair<std::string, c10::IValue>;

  /// An empty dict (c10::Dict itself has no default constructor for IValue values).
  StateDict();
  /// The entries, in this order; a repeated key keeps its last value.
  StateDict(std::initializer_list<Entry> entries);
  /// The same entries as `dict` (shared, not copied).
  StateDict(Dict dict) : dict_(std::move(dict)) {}  // NOLINT(google-explicit-constructor): a view of one

  /// The underlying dict, for LibTorch's APIs.
  const Dict& dict() const { return dict_; }
  Dict& dict() { return dict_; }
  operator const Dict&() const { return dict_; }               // NOLINT(google-explicit-constructor)
  operator c10::IValue() const { return c10::IValue(dict_); }  // NOLINT(google-explicit-constructor)

  c10::IValue at(const std::string& key) const { return dict_.at(key); }
  bool contains(const std::string& key) const { return dict_.contains(key); }
  auto find(const std::string& key) const { return dict_.find(key); }
  template <class V>
  auto insert(const std::string& key, V&& value) const {
    return dict_.insert(key, std::forward<V>(value));
  }
  template <class V>
  auto insert_or_assign(const std::string& key, V&& value) const {
    return dict_.insert_or_assign(key, std::forward<V>(value));
  }
  std::size_t erase(const std::string& key) const { return dict_.erase(key); }
  void clear() const { dict_.clear(); }
  std::size_t size() const { return dict_.size(); }
  bool empty() const { return dict_.empty(); }
  auto begin() const { return dict_.begin(); }
  auto end() const { return dict_.end(); }

  /// A dict with the same keys whose values are not shared with this one (tensors are not cloned).
  StateDict copy() const { return StateDict(dict_.copy()); }

 private:
  Dict dict_;
};

/// A StateDict holding `entries` in their order; the same as StateDict{...}, kept for code that uses it.
inline StateDict make_state_dict(std::initializer_list<StateDict::Entry> entries = {}) { return StateDict(entries); }

}  // namespace ampp
