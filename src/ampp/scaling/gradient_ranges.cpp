// The numerics doctor's range report: exponent histograms of gradients and what fp16/bf16 make of them.
#include <ampp/scaling/gradient_ranges.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>

namespace ampp {
namespace {

int bin_of(int exponent) {
  return std::clamp(exponent - GradientRanges::kLowestExponent, 0, GradientRanges::kBins - 1);
}

// floor(log2 |v|) for a finite nonzero v. frexp gives v = m * 2^x with |m| in [0.5, 1) exactly, so
// floor(log2 |v|) = x - 1 with no rounding at powers of two (log2 would round).
template <typename T>
int exponent_of(T v) {
  int x = 0;
  std::frexp(v, &x);
  return x - 1;
}

// One pass over one gradient: its zeros, non-finite elements and exponent histogram (true values),
// and, when the scale is not a power of two, the histogram of the scaled values (`scaled`, computed
// in double so the product neither overflows nor loses its exponent).
struct GradientCounts {
  std::vector<int64_t> exponents = std::vector<int64_t>(GradientRanges::kBins, 0);
  int64_t zero = 0, non_finite = 0;
};

template <typename T>
void count(const T* data, int64_t n, GradientCounts& c, std::vector<int64_t>* scaled, double scale) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = data[i];
    if (!std::isfinite(v)) {
      ++c.non_finite;
    } else if (v == 0) {
      ++c.zero;
    } else {
      ++c.exponents[bin_of(exponent_of(v))];
      if (scaled) ++(*scaled)[bin_of(exponent_of(static_cast<double>(v) * scale))];
    }
  }
}

GradientCounts count_gradient(const torch::Tensor& gradient, std::vector<int64_t>* scaled, double scale) {
  GradientCounts c;
  // float32 holds fp16 and bf16 values exactly; double stays double. Counted on the host: a GPU's
  // gradient is copied there first (its data pointer is the device's).
  auto t = gradient.detach();
  t = t.to(torch::kCPU, t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat).contiguous();
  if (t.scalar_type() == torch::kDouble) {
    count(t.data_ptr<double>(), t.numel(), c, scaled, scale);
  } else {
    count(t.data_ptr<float>(), t.numel(), c, scaled, scale);
  }
  return c;
}

int highest_bin(const std::vector<int64_t>& histogram) {
  for (int i = GradientRanges::kBins - 1; i >= 0; --i)
    if (histogram[i] > 0) return GradientRanges::kLowestExponent + i;
  return INT_MIN;
}

using Params = std::vector<const GradientRanges::Parameter*>;

RangeCounts total_of(const Params& of, const FloatRange& range, int scale_exponent) {
  RangeCounts total;
  for (const auto* p : of) total += GradientRanges::classify(*p, p->unscaled, range, scale_exponent);
  return total;
}

int64_t nonzero_finite(const RangeCounts& c) { return c.elements - c.zero - c.non_finite; }

double underflow_share(const RangeCounts& c) {
  const int64_t n = nonzero_finite(c);
  return n == 0 ? 0.0 : static_cast<double>(c.underflow) / n;
}

}  // namespace

RangeCounts& operator+=(RangeCounts& a, const RangeCounts& b) {
  a.elements += b.elements, a.zero += b.zero, a.non_finite += b.non_finite, a.underflow += b.underflow;
  a.subnormal += b.subnormal, a.near_overflow += b.near_overflow, a.overflow += b.overflow;
  return a;
}

std::string layer_of(const std::string& parameter_name) {
  const auto dot = parameter_name.rfind('.');
  return dot == std::string::npos ? parameter_name : parameter_name.substr(0, dot);
}

GradientRanges::Parameter& GradientRanges::parameter(const std::string& name) {
  auto [it, added] = index_.emplace(name, parameters_.size());
  if (added) {
    Parameter p;
    p.name = name;
    p.unscaled.assign(kBins, 0);
    p.scaled.assign(kBins, 0);
    parameters_.push_back(std::move(p));
  }
  return parameters_[it->second];
}

namespace {

// `step` (one step's histogram of true gradients) times 2^shift, added to `into`; the end bins clamp.
void add_shifted(std::vector<int64_t>& into, const std::vector<int64_t>& step, int shift) {
  for (int i = 0; i < GradientRanges::kBins; ++i)
    if (step[i] > 0) into[std::clamp(i + shift, 0, GradientRanges::kBins - 1)] += step[i];
}

}  // namespace

void GradientRanges::observe(const std::vector<std::pair<std::string, torch::Tensor>>& gradients, double loss_scale,
                             double loss) {
  TORCH_CHECK(std::isfinite(loss_scale) && loss_scale > 0,
              "GradientRanges::observe: the loss scale must be a positive finite number, got ", loss_scale);
  int scale_exponent = 0;
  // A power of two (every dynamic scale) multiplies exactly: the scaled exponents are a shift.
  const bool power_of_two = std::frexp(loss_scale, &scale_exponent) == 0.5;
  bool non_finite = false;
  for (const auto& [name, gradient] : gradients) {
    if (!gradient.defined()) continue;
    Parameter& p = parameter(name);
    const GradientCounts c = count_gradient(gradient, power_of_two ? nullptr : &p.scaled, loss_scale);
    p.elements += gradient.numel();
    p.non_finite += c.non_finite;
    p.zero += c.zero;
    non_finite |= c.non_finite > 0;
    add_shifted(p.unscaled, c.exponents, 0);
    if (power_of_two) add_shifted(p.scaled, c.exponents, scale_exponent - 1);  // exact: a shift
  }
  ++steps_;
  non_finite_steps_ += non_finite;
  non_finite_loss_steps_ += !std::isfinite(loss);
  non_finite_unit_scale_steps_ += non_finite && loss_scale <= 1;
  last_scale_ = loss_scale;
}

RangeCounts GradientRanges::classify(const Parameter& p, const std::vector<int64_t>& histogram, const FloatRange& range,
                                     int scale_exponent) {
  RangeCounts c;
  c.elements = p.elements, c.zero = p.zero, c.non_finite = p.non_finite;
  for (int i = 0; i < kBins; ++i) {
    const int e = kLowestExponent + i + scale_exponent;  // the bin holds [2^e, 2^(e+1))
    const int64_t n = histogram[i];
    if (e <= range.min_subnormal_exponent - 2) {
      c.underflow += n;  // below half the smallest subnormal: rounds to zero
    } else if (e < range.min_normal_exponent) {
      c.subnormal += n;  // [2^(min_sub-1), 2^min_sub) rounds up to the smallest subnormal (not to 0)
    } else if (e >= range.overflow_exponent) {
      c.overflow += n;
    } else if (e == range.overflow_exponent - 1) {
      c.near_overflow += n;
    }
  }
  return c;
}

RangeCounts GradientRanges::at_used_scales(const Parameter& p, const FloatRange& range) const {
  return classify(p, p.scaled, range, 0);
}

RangeCounts GradientRanges::total_at(const FloatRange& range, int scale_exponent) const {
  Params all;
  for (const auto& p : parameters_) all.push_back(&p);
  return total_of(all, range, scale_exponent);
}

int GradientRanges::highest_exponent(const std::vector<const Parameter*>& of) const {
  int highest = INT_MIN;
  for (const auto* p : of) highest = std::max(highest, highest_bin(p->unscaled));
  return highest;
}

int GradientRanges::fp16_scale_exponent(const std::vector<const Parameter*>& of) const {
  const int highest = highest_exponent(of);
  if (highest == INT_MIN) return 16;  // no nonzero gradient: PyTorch's default 2^16
  // The largest gradient lands in [2^(overflow-2), 2^(overflow-1)): one growth (x2) still fits.
  return std::clamp(kFp16Range.overflow_exponent - 2 - highest, -126, 127);
}

}  // namespace ampp

namespace ampp {
namespace {

// PyTorch's default init_scale 2^16 against the scale that fits.
std::string compared_with_default(int k) {
  if (k < 16) return fmt::format(" (PyTorch's default 2^16 would overflow and back off {} times first)", 16 - k);
  if (k > 16)
    return fmt::format(" (2^{} above PyTorch's default 2^16, which the dynamic scale reaches by growing)", k - 16);
  return " (PyTorch's default)";
}

// fp16 without the layer whose gradients reach highest, if that lets the rest fit.
bool try_without_highest_layer(const GradientRanges& r, const Params& all, RangeAdvice& advice) {
  const int highest = r.highest_exponent(all);
  std::set<std::string> culprits;
  for (const auto* p : all)
    if (r.highest_exponent({p}) == highest) culprits.insert(layer_of(p->name));
  if (culprits.size() != 1) return false;
  const std::string& layer = *culprits.begin();
  Params rest;
  for (const auto* p : all)
    if (layer_of(p->name) != layer) rest.push_back(p);
  const int k = r.fp16_scale_exponent(rest);
  const RangeCounts c = total_of(rest, kFp16Range, k);
  if (rest.empty() || underflow_share(c) > GradientRanges::kUnderflowTolerance) return false;
  advice.dtype = "fp16";
  advice.init_scale = std::ldexp(1.0, k);
  advice.keep_fp32 = {layer};
  advice.reasons.push_back(fmt::format(
      "{}'s gradients reach 2^{} and set the scale alone: kept in FP32, the others fit fp16 at loss scale 2^{} "
      "with {:.3g}% of their nonzero elements flushing to zero",
      layer, highest, k, 100 * underflow_share(c)));
  return true;
}

}  // namespace

RangeAdvice GradientRanges::recommend() const {
  RangeAdvice advice;
  if (non_finite_loss_steps_ > 0 || non_finite_unit_scale_steps_ > 0) {
    advice.lower_learning_rate = true;
    advice.reasons.push_back(fmt::format(
        "{} of {} steps had an inf/NaN loss and {} had inf/NaN gradients at a loss scale <= 1: the model "
        "diverges, which no loss scale or format fixes; lower the learning rate (or check the data). The range "
        "advice that follows includes the diverging steps' gradients: run the doctor again after that",
        non_finite_loss_steps_, steps_, non_finite_unit_scale_steps_));
  }
  Params all;
  for (const auto& p : parameters_) all.push_back(&p);
  const int highest = highest_exponent(all);
  if (highest == INT_MIN) {
    advice.dtype = "fp16";
    advice.init_scale = std::ldexp(1.0, 16);
    advice.reasons.push_back("no finite nonzero gradient was observed: nothing to fit");
    return advice;
  }
  const int k = fp16_scale_exponent(all);
  const RangeCounts fp16 = total_of(all, kFp16Range, k);
  if (underflow_share(fp16) <= kUnderflowTolerance) {
    advice.dtype = "fp16";
    advice.init_scale = std::ldexp(1.0, k);
    advice.reasons.push_back(fmt::format(
        "fp16 holds the gradients: at loss scale 2^{}{} the largest gradient (in [2^{}, 2^{})) stays 2x below "
        "overflow and {:.3g}% of the nonzero elements flush to zero",
        k, compared_with_default(k), highest, highest + 1, 100 * underflow_share(fp16)));
    return advice;
  }
  if (try_without_highest_layer(*this, all, advice)) return advice;
  const RangeCounts bf16 = total_of(all, kBf16Range, 0);
  advice.dtype = "bf16";
  advice.init_scale = 1;
  advice.reasons.push_back(fmt::format(
      "fp16 cannot hold both ends: at the largest safe loss scale 2^{} {:.3g}% of the nonzero gradient elements "
      "flush to zero; bf16 (float32's exponent range) loses {:.3g}% with no loss scaling",
      k, 100 * underflow_share(fp16), 100 * underflow_share(bf16)));
  return advice;
}

}  // namespace ampp
