#pragma once
// The tensors inside a model's inputs and outputs, as apex's applier finds them: a tensor, or any nesting of
// std::tuple, std::pair, std::vector, std::optional and str-keyed std::map / std::unordered_map around tensors.
// Amp::forward casts each tensor it finds (the inputs to the model's dtype under O2/O3, the outputs to
// float32), so that an LSTM's (output, (h, c)) is cast as a bare tensor is. The nesting is of types, walked at
// compile time: no data decides how deep it goes.
#include <torch/types.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ampp::detail {

template <typename T>
struct is_tuple_like : std::false_type {};
template <typename... Ts>
struct is_tuple_like<std::tuple<Ts...>> : std::true_type {};
template <typename A, typename B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};

template <typename T>
struct is_vector : std::false_type {};
template <typename T, typename A>
struct is_vector<std::vector<T, A>> : std::true_type {};

template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};

template <typename T>
struct is_string_map : std::false_type {};
template <typename V, typename C, typename A>
struct is_string_map<std::map<std::string, V, C, A>> : std::true_type {};
template <typename V, typename H, typename E, typename A>
struct is_string_map<std::unordered_map<std::string, V, H, E, A>> : std::true_type {};

// A type whose tensors cast_nested() reaches (a tensor itself, or one of the containers above).
template <typename T>
inline constexpr bool is_walkable_v =
    std::is_same_v<T, torch::Tensor> || is_tuple_like<T>::value ||
    (is_vector<T>::value && !std::is_same_v<T, std::vector<bool>>) || is_optional<T>::value || is_string_map<T>::value;

// Types that hold no tensor and need no walk: numbers, strings, and empty values.
template <typename T>
inline constexpr bool holds_no_tensor_v =
    std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string> || std::is_same_v<T, std::nullopt_t>;

// Warns once per type (the demangled name): a model output of a type Amp::forward cannot look into passes
// through uncast, so its tensors keep the model's dtype (under O2, not float32).
void warn_uncast_output_type(const std::type_info& type);

// Replaces every tensor inside `value` with cast(tensor). `warn_unknown`: warn about a type it cannot walk.
template <typename T, typename Cast>
void cast_nested(T& value, const Cast& cast, bool warn_unknown) {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, torch::Tensor>) {
    value = cast(value);
  } else if constexpr (is_tuple_like<U>::value) {
    std::apply([&](auto&... items) { (cast_nested(items, cast, warn_unknown), ...); }, value);
  } else if constexpr (is_vector<U>::value && !std::is_same_v<U, std::vector<bool>>) {
    for (auto& item : value) cast_nested(item, cast, warn_unknown);
  } else if constexpr (is_optional<U>::value) {
    if (value) cast_nested(*value, cast, warn_unknown);
  } else if constexpr (is_string_map<U>::value) {
    for (auto& item : value) cast_nested(item.second, cast, warn_unknown);
  } else if constexpr (!holds_no_tensor_v<U>) {
    if (warn_unknown) warn_uncast_output_type(typeid(U));
  }
}

}  // namespace ampp::detail
