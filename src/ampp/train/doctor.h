#pragma once
// The numerics doctor's outputs (`ampp doctor`, `ampp train --doctor`): doctor.json and
// doctor_gradients.png from an ampp::GradientRanges report. Layout: docs/numerics.md. Internal (the
// trainer and the CLI); a program reads the same report from doctor.json.
#include <ampp/scaling/gradient_ranges.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ampp::train {

// The report: steps, per-parameter fractions at the loss scales used, exponent histograms, totals at
// the used and at the recommended scale, and the recommendation.
nlohmann::json doctor_json(const GradientRanges& ranges);

// The recommendation in a few lines for the terminal ("doctor: ...").
std::vector<std::string> doctor_summary(const GradientRanges& ranges);

// Writes `out_dir`/doctor.json (with `first_non_finite`, the replay of the first skipped step, unless
// null) and, with `plots`, `out_dir`/doctor_gradients.png (gnuplot), both atomically. Returns the paths.
std::vector<std::string> write_doctor_report(const GradientRanges& ranges, const nlohmann::json& first_non_finite,
                                             const std::string& out_dir, bool plots);

}  // namespace ampp::train
