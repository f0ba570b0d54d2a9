#pragma once
// ampp::Properties: apex's opt-level property table, overridable per property.
//
//   ampp::Properties(ampp::OptLevel::O2)                      // the level's defaults
//   ampp::Properties("O2").loss_scale(128.0)                  // static loss scale
//   ampp::Properties("O2").keep_batchnorm_fp32(false)         // BatchNorm in low precision too
//   ampp::Properties("O1").master_weights(true)               // throws: apex forbids this override
//
// Defaults per level (apex's table; "low" is the low-precision dtype, see dtype()):
//
//   property               O0        O1        O2         O3
//   cast_model_type        float32   (none)    low        low
//   patch_torch_functions  false     true      false      false     (O1's autocast; O2/O3's forward runs in a
//                                                                    region of the model's dtype too)
//   keep_batchnorm_fp32    (none)    (none)    true       false
//   master_weights         false     (none)    true       false
//   loss_scale             1.0       dynamic   dynamic    1.0
//
// Setters check apex's override rules against the level at the moment they are called and throw
// with what to do instead (apex raises the same errors unless hard_override, which ampp omits).

#include <ampp/amp/opt_level.h>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <ostream>
#include <string>

namespace ampp {

/// apex's loss_scale: "dynamic" (GradScaler-style growth and backoff) or a static positive number.
class LossScale {
 public:
  /// Dynamic.
  LossScale() = default;
  static LossScale dynamic() { return LossScale(); }
  /// Static: every loss is multiplied by `value` (finite, > 0).
  LossScale(double value);  // NOLINT(google-explicit-constructor): loss_scale(128.0) reads like apex
  /// "dynamic" or a number such as "128.0" (apex accepts anything float() converts).
  LossScale(const std::string& text);  // NOLINT(google-explicit-constructor)
  LossScale(const char* text);         // NOLINT(google-explicit-constructor)

  bool is_dynamic() const { return dynamic_; }
  /// The static scale. Throws for a dynamic LossScale.
  double value() const;
  /// "dynamic" or the number.
  std::string to_string() const;

  bool operator==(const LossScale& other) const {
    return dynamic_ == other.dynamic_ && (dynamic_ || value_ == other.value_);
  }

 private:
  bool dynamic_ = true;
  double value_ = 0.0;
};

/// The low-precision dtype ampp uses when Properties::dtype() is not set: bf16 on CPU (the only type
/// with CPU kernels in LibTorch 1.13), fp16 on CUDA (apex's choice).
c10::ScalarType default_low_precision_dtype(c10::DeviceType device_type);

class Properties {
 public:
  /// The defaults of `level`. apex's default level is O1.
  Properties(OptLevel level = OptLevel::O1);  // NOLINT(google-explicit-constructor)
  /// parse_opt_level(level): "O0".."O3".
  Properties(const std::string& level);  // NOLINT(google-explicit-constructor)
  Properties(const char* level);         // NOLINT(google-explicit-constructor)

  OptLevel opt_level() const { return opt_level_; }

  // ---- apex's properties ---------------------------------------------------------------------

  /// false: initialize() returns a pass-through handle (no casts, no scaling, no masters).
  bool enabled() const { return enabled_; }
  Properties& enabled(bool value);

  /// The dtype the model's floating-point parameters and buffers are cast to; nullopt = not cast.
  /// For O2/O3 this is dtype() unless overridden. O1 accepts only float32 (or nullopt).
  /// Overriding with kHalf/kBFloat16 also sets dtype().
  c10::optional<c10::ScalarType> cast_model_type() const;
  Properties& cast_model_type(c10::ScalarType type);
  Properties& cast_model_type(c10::nullopt_t);

  /// O1's switch: the forward of an FP32 model under ampp::autocast (apex patches torch functions instead).
  /// A model cast to a low dtype (O2/O3) gets a region of that dtype either way (docs/opt_levels.md).
  bool patch_torch_functions() const { return patch_torch_functions_; }
  Properties& patch_torch_functions(bool value);

  /// Keep BatchNorm modules (affine ones, as apex) in FP32 when the model is cast. Not with O1.
  c10::optional<bool> keep_batchnorm_fp32() const { return keep_batchnorm_fp32_; }
  Properties& keep_batchnorm_fp32(bool value);
  Properties& keep_batchnorm_fp32(c10::nullopt_t);
  /// apex also accepts the strings "True" and "False".
  Properties& keep_batchnorm_fp32(const std::string& value);
  Properties& keep_batchnorm_fp32(const char* value);

  /// The optimizer steps FP32 master copies of the low-precision parameters. Not with O1.
  c10::optional<bool> master_weights() const { return master_weights_; }
  Properties& master_weights(bool value);
  Properties& master_weights(c10::nullopt_t);
  Properties& master_weights(const char*) = delete;  // no silent pointer-to-bool conversion

  LossScale loss_scale() const { return loss_scale_; }
  Properties& loss_scale(LossScale value);

  // ---- apex's initialize() arguments ---------------------------------------------------------

  /// dtype of the model's floating outputs under forward(); nullopt = float32 when the model is cast
  /// or autocast (so the loss is computed in FP32, as apex), unchanged otherwise.
  c10::optional<c10::ScalarType> cast_model_outputs() const { return cast_model_outputs_; }
  Properties& cast_model_outputs(c10::optional<c10::ScalarType> type);

  /// Number of losses with their own loss scaler (scale_loss(loss, loss_id)). >= 1.
  int64_t num_losses() const { return num_losses_; }
  Properties& num_losses(int64_t value);

  /// Floor of the dynamic scale (apex min_loss_scale; nullopt = no floor).
  c10::optional<double> min_loss_scale() const { return min_loss_scale_; }
  Properties& min_loss_scale(c10::optional<double> value);

  /// Cap of the dynamic scale (apex max_loss_scale = 2^24).
  double max_loss_scale() const { return max_loss_scale_; }
  Properties& max_loss_scale(double value);

  /// 0: silent; 1: the chosen properties at initialize() and one line per skipped step (apex default).
  int verbosity() const { return verbosity_; }
  Properties& verbosity(int value);

  // ---- ampp ------------------------------------------------------------------------------------

  /// The low-precision dtype: O1's autocast dtype and O2/O3's cast_model_type. nullopt (default):
  /// default_low_precision_dtype() of the model's device, resolved by initialize().
  c10::optional<c10::ScalarType> dtype() const { return dtype_; }
  Properties& dtype(c10::ScalarType type);

  /// fp16 on CPU, where LibTorch has no fp16 kernels: true (default) emulates it (float32 carriers
  /// holding IEEE-half values, see docs/opt_levels.md); false makes fp16 on CPU an error.
  bool emulate_fp16() const { return emulate_fp16_; }
  Properties& emulate_fp16(bool value);

  /// Measure the time spent in ampp's own machinery (scaler, grad copies, master copy-back, input and
  /// output casts); read it with Amp::profile(). Off by default (it reads a clock a few times a step).
  bool profile() const { return profile_; }
  Properties& profile(bool value);

  /// The device type the defaults resolve against (set by initialize() from the model).
  c10::DeviceType device_type() const { return device_type_; }
  Properties& device_type(c10::DeviceType type);

  /// dtype() resolved against device_type().
  c10::ScalarType resolved_dtype() const;

  /// One "name : value" line per property, as apex prints them.
  std::string to_string() const;

 private:
  OptLevel opt_level_;
  bool enabled_ = true;
  bool cast_follows_dtype_ = false;  // O2/O3: cast_model_type() is dtype()
  c10::optional<c10::ScalarType> cast_model_type_;
  bool patch_torch_functions_ = false;
  c10::optional<bool> keep_batchnorm_fp32_;
  c10::optional<bool> master_weights_;
  LossScale loss_scale_;
  c10::optional<c10::ScalarType> cast_model_outputs_;
  int64_t num_losses_ = 1;
  c10::optional<double> min_loss_scale_;
  double max_loss_scale_ = 16777216.0;  // 2^24
  int verbosity_ = 1;
  c10::optional<c10::ScalarType> dtype_;
  bool emulate_fp16_ = true;
  bool profile_ = false;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
};

std::ostream& operator<<(std::ostream& os, const Properties& properties);

}  // namespace ampp
