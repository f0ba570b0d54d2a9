#pragma once
// The numerics doctor's outputs (`ampp doctor`, `ampp train --doctor`): doctor.json and
// doctor_gradients.png from an ampp::GradientRanges report. Layout: docs/numerics.md. Internal (the
// trainer and the CLI); a program reads the same report from doctor.json.
#include <ampp/precision/float8_ranges.h>
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

// The fp8 part (`--dtype fp8`): per Float8Linear and tensor, the format, the largest |value| x scale over
// the format's largest value, the fractions saturated and flushed to zero; and the tensor that saturated
// first. doctor_fp8_summary: the terminal's lines.
nlohmann::json doctor_fp8_json(const Float8RangeRecorder& recorder);
std::vector<std::string> doctor_fp8_summary(const Float8RangeRecorder& recorder);

// Writes `out_dir`/doctor.json (with `first_non_finite`, the replay of the first skipped step, and `fp8`,
// doctor_fp8_json's, unless null) and, with `plots`, `out_dir`/doctor_gradients.png (gnuplot), both atomically. Returns
// the paths.
std::vector<std::string> write_doctor_report(const GradientRanges& ranges, const nlohmann::json& first_non_finite,
                                             const nlohmann::json& fp8, const std::string& out_dir, bool plots);

}  // namespace ampp::train
