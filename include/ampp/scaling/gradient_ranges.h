#pragma once
// ampp::GradientRanges: the numerics doctor's range report. It records, step after step, where the
// binary exponents of every parameter's gradient fall, and says how much of it fp16 and bf16 hold at
// a loss scale: what would flush to zero (underflow), lose precision (subnormal), or sit within 2x of
// overflow. From the same histograms it recommends a loss scale, or bf16, or a layer to keep in FP32.
//
//   ampp::GradientRanges ranges;
//   auto scaled = amp.scale_loss(loss);
//   scaled.backward();
//   ranges.observe(named_gradients, scaled.scale(), loss.item<double>());   // before step()
//   auto advice = ranges.recommend();
//
// Counting is by binary exponent, exactly: a value v falls in bin floor(log2|v|), and every threshold
// below is a power of two, so each bin lies wholly on one side of it. The classes are of the value
// before rounding: rounding carries the few values within half a step below a class boundary over it
// (just below 2^min_normal up to the smallest normal; [65520, 2^16) up to inf in fp16). See
// docs/numerics.md.
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ampp {

/// A low-precision format's range as binary exponents.
struct FloatRange {
  const char* name;
  int min_subnormal_exponent;  ///< the smallest subnormal is 2^this
  int min_normal_exponent;     ///< the smallest normal number is 2^this
  int overflow_exponent;       ///< values >= 2^this are beyond the largest finite number
};
constexpr FloatRange kFp16Range{"fp16", -24, -14, 16};     // 2^-24 .. 65504 < 2^16
constexpr FloatRange kBf16Range{"bf16", -133, -126, 128};  // 2^-133 .. ~3.39e38 < 2^128

/// Element counts of gradients against one format at one scale. The classes are disjoint.
struct RangeCounts {
  int64_t elements = 0;       ///< all elements, finite or not
  int64_t zero = 0;           ///< exactly zero (in an fp16 run: including what already flushed)
  int64_t non_finite = 0;     ///< inf or NaN
  int64_t underflow = 0;      ///< nonzero, below half the smallest subnormal: rounds to zero
  int64_t subnormal = 0;      ///< rounds into the subnormal range (fewer significant bits)
  int64_t near_overflow = 0;  ///< in [2^(overflow-1), 2^overflow): within 2x of the largest number
  int64_t overflow = 0;       ///< >= 2^overflow: inf in this format
  double fraction(int64_t count) const { return elements == 0 ? 0.0 : static_cast<double>(count) / elements; }
};

RangeCounts& operator+=(RangeCounts& a, const RangeCounts& b);

/// What the report advises; `reasons` says why in words.
struct RangeAdvice {
  std::string dtype;                   ///< "fp16" or "bf16"
  double init_scale = 1;               ///< a power of two (GradScalerOptions::init_scale); 1 for bf16
  std::vector<std::string> keep_fp32;  ///< layers whose gradients alone do not fit fp16 with the rest
  bool lower_learning_rate = false;    ///< the loss itself or gradients at a scale <= 1 were inf/NaN
  std::vector<std::string> reasons;
};

class GradientRanges {
 public:
  /// Histogram bins: binary exponents kLowestExponent..kHighestExponent; values beyond either end are
  /// counted in the end bins (all of them underflow, or overflow, in both formats).
  static constexpr int kLowestExponent = -150;
  static constexpr int kHighestExponent = 128;
  static constexpr int kBins = kHighestExponent - kLowestExponent + 1;
  /// Above this fraction of nonzero elements flushing to zero, a format is said not to hold the gradients.
  static constexpr double kUnderflowTolerance = 0.01;

  struct Parameter {
    std::string name;
    std::vector<int64_t> unscaled;  ///< exponent histogram of the true (unscaled) gradients
    std::vector<int64_t> scaled;    ///< the same times the step's loss scale (the values backward made)
    int64_t zero = 0;
    int64_t non_finite = 0;
    int64_t elements = 0;
  };

  /// Records one step: each parameter's gradient as the optimizer would see it (unscaled) and the loss
  /// scale its backward used. Call it between backward and step (a skipped step drops the gradients).
  /// Undefined gradients are left out; the names must be the same at every step.
  void observe(const std::vector<std::pair<std::string, torch::Tensor>>& gradients, double loss_scale, double loss);

  int64_t steps() const { return steps_; }
  int64_t steps_with_non_finite_gradients() const { return non_finite_steps_; }
  int64_t steps_with_non_finite_loss() const { return non_finite_loss_steps_; }
  /// Steps whose gradients were inf/NaN although their loss scale was <= 1: not a loss-scale overflow.
  int64_t non_finite_steps_at_unit_scale() const { return non_finite_unit_scale_steps_; }
  double last_loss_scale() const { return last_scale_; }
  const std::vector<Parameter>& parameters() const { return parameters_; }

  /// Counts of `histogram` against `range` with every value multiplied by 2^scale_exponent.
  static RangeCounts classify(const Parameter& p, const std::vector<int64_t>& histogram, const FloatRange& range,
                              int scale_exponent);
  /// At the loss scales the steps used (the scaled histogram).
  RangeCounts at_used_scales(const Parameter& p, const FloatRange& range) const;
  /// All parameters together, the true gradients times 2^scale_exponent.
  RangeCounts total_at(const FloatRange& range, int scale_exponent) const;
  /// The largest e with a finite nonzero |gradient| in [2^e, 2^(e+1)) among `of`; INT_MIN when none.
  int highest_exponent(const std::vector<const Parameter*>& of) const;
  /// The largest power-of-two scale exponent that leaves the largest gradient of `of` 2x below fp16's
  /// overflow (so the dynamic scale does not overflow at its first growth).
  int fp16_scale_exponent(const std::vector<const Parameter*>& of) const;
  RangeAdvice recommend() const;

 private:
  Parameter& parameter(const std::string& name);
  std::vector<Parameter> parameters_;  // in the order first seen
  std::map<std::string, size_t> index_;
  int64_t steps_ = 0;
  int64_t non_finite_steps_ = 0;
  int64_t non_finite_loss_steps_ = 0;
  int64_t non_finite_unit_scale_steps_ = 0;
  double last_scale_ = 1;
};

/// The layer a parameter belongs to: its module path without the last component ("fc1.weight" -> "fc1").
std::string layer_of(const std::string& parameter_name);

}  // namespace ampp
