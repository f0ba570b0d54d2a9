// Amp::forward's warning about an output type it cannot look into (nested_tensors.h).
#include <ampp/amp/nested_tensors.h>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>

#include <mutex>
#include <set>
#include <string>

namespace ampp::detail {

void warn_uncast_output_type(const std::type_info& type) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  const std::string name = c10::demangle(type.name());
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(name).second) return;
  }
  TORCH_WARN("ampp::Amp::forward: the model returned a ", name,
             ", which forward() cannot look into, so its tensors keep the model's dtype instead of being cast to "
             "float32 (Properties::cast_model_outputs). Return a tensor, or tuples, pairs, vectors, optionals or "
             "str-keyed maps of tensors, or cast the output with amp.cast_output().");
}

}  // namespace ampp::detail
