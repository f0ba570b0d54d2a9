// The numerics doctor's fp8 part (doctor.h): how the Float8Linear layers' casts used their formats.
#include <fmt/format.h>

#include <algorithm>

#include "doctor.h"

namespace ampp::train {
namespace {

double fraction(int64_t part, int64_t whole) { return whole > 0 ? static_cast<double>(part) / whole : 0.0; }

std::string format_name(c10::ScalarType t) { return t == c10::ScalarType::Float8_e5m2 ? "e5m2" : "e4m3"; }

std::string who(const Float8TensorRange& r) {
  return fmt::format("{}'s {}", r.layer.empty() ? "?" : r.layer, r.tensor);
}

}  // namespace

nlohmann::json doctor_fp8_json(const Float8RangeRecorder& recorder) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& r : recorder.ranges()) {
    tensors.push_back({{"layer", r.layer},
                       {"tensor", r.tensor},
                       {"format", format_name(r.format)},
                       {"casts", r.casts},
                       {"max_range_used", r.max_range_used},
                       {"saturated", fraction(r.saturated, r.values)},
                       {"flushed_to_zero", fraction(r.flushed, r.values)},
                       {"first_saturated_step", r.first_saturated_step >= 0 ? nlohmann::json(r.first_saturated_step)
                                                                            : nlohmann::json(nullptr)}});
  }
  const auto first = recorder.first_saturated();
  return {
      {"tensors", tensors},
      {"first_saturated",
       first ? nlohmann::json{{"layer", first->layer}, {"tensor", first->tensor}, {"step", first->first_saturated_step}}
             : nlohmann::json(nullptr)}};
}

std::vector<std::string> doctor_fp8_summary(const Float8RangeRecorder& recorder) {
  const auto ranges = recorder.ranges();
  if (ranges.empty()) return {"doctor: fp8: no fp8 cast in a training pass (no layer converted?)"};
  std::vector<std::string> lines;
  if (const auto first = recorder.first_saturated()) {
    lines.push_back(
        fmt::format("doctor: fp8: {} went out of {}'s range first, at step {} ({:.3g}% of its values "
                    "saturated over the run)",
                    who(*first), format_name(first->format), first->first_saturated_step,
                    100 * fraction(first->saturated, first->values)));
  } else {
    lines.push_back("doctor: fp8: no value saturated");
  }
  const auto most = *std::max_element(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
    return fraction(a.flushed, a.values) < fraction(b.flushed, b.values);
  });
  lines.push_back(fmt::format("doctor: fp8: most flushed to zero: {} in {}, {:.3g}% of its values", who(most),
                              format_name(most.format), 100 * fraction(most.flushed, most.values)));
  return lines;
}

}  // namespace ampp::train
