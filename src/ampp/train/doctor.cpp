// doctor.json and doctor_gradients.png from the numerics doctor's range report.
#include <ampp/train/metrics.h>
#include <ampp/util/atomic_file.h>
#include <fmt/format.h>

#include <climits>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "doctor.h"
#include "report_json.h"

namespace fs = std::filesystem;

namespace ampp::train {
namespace {

nlohmann::json fractions(const RangeCounts& c) {
  return {{"elements", c.elements},
          {"zero", c.fraction(c.zero)},
          {"non_finite", c.fraction(c.non_finite)},
          {"underflow", c.fraction(c.underflow)},
          {"subnormal", c.fraction(c.subnormal)},
          {"near_overflow", c.fraction(c.near_overflow)},
          {"overflow", c.fraction(c.overflow)}};
}

template <typename At>
nlohmann::json both_formats(At at) {
  return {{"fp16", fractions(at(kFp16Range))}, {"bf16", fractions(at(kBf16Range))}};
}

// [[exponent, count], ...] for the nonempty bins, lowest first.
nlohmann::json exponents_json(const std::vector<int64_t>& histogram) {
  auto j = nlohmann::json::array();
  for (int i = 0; i < GradientRanges::kBins; ++i)
    if (histogram[i] > 0) j.push_back({GradientRanges::kLowestExponent + i, histogram[i]});
  return j;
}

int scale_exponent(double scale) { return std::ilogb(scale); }

nlohmann::json parameter_json(const GradientRanges& r, const GradientRanges::Parameter& p) {
  const int highest = r.highest_exponent({&p});
  return {{"name", p.name},
          {"layer", layer_of(p.name)},
          {"highest_exponent", highest == INT_MIN ? nlohmann::json(nullptr) : nlohmann::json(highest)},
          {"at_used_scales", both_formats([&](const FloatRange& f) { return r.at_used_scales(p, f); })},
          {"exponents", exponents_json(p.unscaled)}};
}

}  // namespace

nlohmann::json doctor_json(const GradientRanges& r) {
  const RangeAdvice advice = r.recommend();
  const int k = scale_exponent(advice.init_scale);
  nlohmann::json j = {{"steps", r.steps()},
                      {"steps_with_non_finite_gradients", r.steps_with_non_finite_gradients()},
                      {"steps_with_non_finite_loss", r.steps_with_non_finite_loss()},
                      {"last_loss_scale", r.last_loss_scale()},
                      {"recommendation",
                       {{"dtype", advice.dtype},
                        {"init_scale", advice.init_scale},
                        {"keep_fp32", advice.keep_fp32},
                        {"lower_learning_rate", advice.lower_learning_rate},
                        {"reasons", advice.reasons}}}};
  auto used = [&](const FloatRange& f) {
    RangeCounts total;
    for (const auto& p : r.parameters()) total += r.at_used_scales(p, f);
    return total;
  };
  j["total"] = {{"at_used_scales", both_formats(used)},
                {"at_recommended_scale", both_formats([&](const FloatRange& f) { return r.total_at(f, k); })}};
  j["parameters"] = nlohmann::json::array();
  for (const auto& p : r.parameters()) j["parameters"].push_back(parameter_json(r, p));
  return j;
}

std::vector<std::string> doctor_summary(const GradientRanges& r) {
  const RangeAdvice advice = r.recommend();
  std::vector<std::string> lines;
  std::string what = fmt::format("doctor: {} steps observed; recommendation: {}", r.steps(), advice.dtype);
  if (advice.dtype == "fp16") what += fmt::format(", init_scale 2^{}", scale_exponent(advice.init_scale));
  for (const auto& layer : advice.keep_fp32) what += fmt::format(", keep {} in FP32", layer);
  if (advice.lower_learning_rate) what += ", and lower the learning rate";
  lines.push_back(what);
  for (const auto& reason : advice.reasons) lines.push_back("doctor: " + reason);
  return lines;
}

}  // namespace ampp::train

namespace ampp::train {
namespace {

struct LayerHistogram {
  std::string layer;
  std::vector<int64_t> counts = std::vector<int64_t>(GradientRanges::kBins, 0);
  int64_t total = 0;  // nonzero finite elements
};

std::vector<LayerHistogram> by_layer(const GradientRanges& r) {
  std::vector<LayerHistogram> layers;
  std::map<std::string, size_t> index;
  layers.push_back({"all"});
  for (const auto& p : r.parameters()) {
    auto [it, added] = index.emplace(layer_of(p.name), layers.size());
    if (added) layers.push_back({it->first});
    for (auto* h : {&layers[it->second], &layers[0]})
      for (int i = 0; i < GradientRanges::kBins; ++i) h->counts[i] += p.unscaled[i], h->total += p.unscaled[i];
  }
  return layers;
}

// exponent, then % of each layer's nonzero elements ('?' where none: gnuplot's missing value on a log axis).
std::string exponents_table(const std::vector<LayerHistogram>& layers, int lo, int hi) {
  std::ostringstream f;
  f << "exponent";
  for (const auto& l : layers) f << ' ' << l.layer;
  f << '\n';
  for (int e = lo; e <= hi; ++e) {
    f << e;
    for (const auto& l : layers) {
      const int64_t n = l.counts[e - GradientRanges::kLowestExponent];
      if (n == 0 || l.total == 0) {
        f << " ?";
      } else {
        f << ' ' << 100.0 * static_cast<double>(n) / static_cast<double>(l.total);
      }
    }
    f << '\n';
  }
  return f.str();
}

// The script: one line per layer; fp16's range at the run's last scale as shaded bands (normal,
// subnormal); the range at the recommended scale as dashed lines.
std::string doctor_script(const GradientRanges& r, const std::string& data, const std::string& png, int columns, int lo,
                          int hi) {
  const RangeAdvice advice = r.recommend();
  const double s = std::log2(r.last_loss_scale());
  const int k = std::ilogb(advice.init_scale);
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1200,560 font 'sans,10'\nset output " << gnuplot_quoted(png + ".tmp") << "\n"
     << "set datafile missing '?'\nset grid\nset key top left box opaque\nset logscale y 10\n"
     << "set xrange [" << lo << ":" << hi << "]\nset yrange [1e-4:100]\n"
     << "set xlabel 'binary exponent e of the true (unscaled) gradient: |g| in [2^e, 2^{e+1})'\n"
     << "set ylabel '% of the layer''s nonzero gradient elements'\n"
     << fmt::format("set title 'gradient exponents over {} steps; recommendation: {}{}'\n", r.steps(), advice.dtype,
                    advice.dtype == "fp16" ? fmt::format(", init\\_scale 2^{{{}}}", k) : std::string())
     << fmt::format(
            "set object 1 rect from {0}, graph 0 to {1}, graph 1 fc rgb '#d8ecff' fs solid 1.0 noborder behind\n",
            -14 - s, 16 - s)
     << fmt::format(
            "set object 2 rect from {0}, graph 0 to {1}, graph 1 fc rgb '#eef6ff' fs solid 1.0 noborder behind\n",
            -25 - s, -14 - s)
     << fmt::format("set label 1 'fp16 at the last loss scale 2^{{{:g}}}' at {}, graph 0.97 right front\n", s, 15.5 - s)
     << fmt::format(
            "set label 3 'normal' at {}, graph 0.03 left front\nset label 4 'subnormal' at {}, graph 0.03 left front\n",
            -13.5 - s, -24.5 - s)
     << fmt::format("set arrow 1 from {0}, graph 0 to {0}, graph 1 nohead dt 2 lw 2 lc rgb '#2a9d2a' front\n", -25 - k)
     << fmt::format("set arrow 2 from {0}, graph 0 to {0}, graph 1 nohead dt 2 lw 2 lc rgb '#2a9d2a' front\n", 15 - k)
     << fmt::format("set label 2 'fp16 at 2^{{{}}} (dashed)' at {}, graph 0.92 right front tc rgb '#2a9d2a'\n", k,
                    14.5 - k)
     << "plot for [i=2:" << columns + 1 << "] " << gnuplot_quoted(data)
     << " using 1:i with linespoints lw 2 pt 7 ps 0.6 title columnheader(i)\n";
  return gp.str();
}

}  // namespace

std::vector<std::string> write_doctor_report(const GradientRanges& r, const nlohmann::json& first_non_finite,
                                             const nlohmann::json& fp8, const std::string& out_dir, bool plots) {
  const fs::path out(out_dir);
  std::vector<std::string> written{(out / "doctor.json").string()};
  auto report = doctor_json(r);
  if (!first_non_finite.is_null()) report["first_non_finite"] = first_non_finite;
  if (!fp8.is_null()) report["fp8"] = fp8;
  write_file_atomic(written[0], report.dump(2) + "\n");
  const auto layers = by_layer(r);
  int lo = INT_MAX, hi = INT_MIN;
  for (int i = 0; i < GradientRanges::kBins; ++i)
    if (layers[0].counts[i] > 0)
      lo = std::min(lo, GradientRanges::kLowestExponent + i), hi = GradientRanges::kLowestExponent + i;
  if (!plots || hi == INT_MIN) return written;
  // The fp16 band of the last scale in view too, where it is near the data.
  const int s = std::ilogb(r.last_loss_scale());
  lo = std::max(std::max(std::min(lo, -25 - s), lo - 12) - 1, GradientRanges::kLowestExponent);
  hi = std::min(std::min(std::max(hi, 16 - s), hi + 12) + 1, GradientRanges::kHighestExponent);
  const fs::path data = out / "plot_data";
  fs::create_directories(data);
  write_file_atomic((data / "doctor_exponents.dat").string(), exponents_table(layers, lo, hi));
  const std::string png = (out / "doctor_gradients.png").string();
  const std::string script = (data / "doctor.gp").string();
  write_file_atomic(
      script, doctor_script(r, (data / "doctor_exponents.dat").string(), png, static_cast<int>(layers.size()), lo, hi));
  run_gnuplot(script, {png});
  written.push_back(png);
  return written;
}

}  // namespace ampp::train
