#include <ampp/amp/properties.h>
#include <ampp/util/parse_number.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <sstream>

namespace ampp {
namespace {

bool is_low_precision(c10::ScalarType t) { return t == c10::kHalf || t == c10::kBFloat16; }

std::string describe(const c10::optional<c10::ScalarType>& t) { return t ? c10::toString(*t) : "None"; }
std::string describe(const c10::optional<bool>& b) { return b ? (*b ? "True" : "False") : "None"; }

}  // namespace

// ---- LossScale ---------------------------------------------------------------------------------

LossScale::LossScale(double value) : dynamic_(false), value_(value) {
  TORCH_CHECK(std::isfinite(value) && value > 0.0, "loss_scale must be \"dynamic\" or a finite number > 0, got ", value,
              ". A static scale multiplies every loss; use e.g. 128.0, or \"dynamic\".");
}

LossScale::LossScale(const char* text) : LossScale(std::string(text ? text : "")) {}

LossScale::LossScale(const std::string& text) {
  if (text == "dynamic") return;
  const auto value = parse_real(text);
  TORCH_CHECK(value, "loss_scale must be \"dynamic\" or a number such as \"128.0\", got '", text, "'.");
  *this = LossScale(*value);
}

double LossScale::value() const {
  TORCH_CHECK(!dynamic_,
              "LossScale::value(): this loss scale is dynamic; ask the handle for the live scale "
              "(Amp::loss_scale()).");
  return value_;
}

std::string LossScale::to_string() const {
  if (dynamic_) return "dynamic";
  std::ostringstream os;
  os << value_;
  return os.str();
}

c10::ScalarType default_low_precision_dtype(c10::DeviceType device_type) {
  return device_type == c10::DeviceType::CUDA ? c10::kHalf : c10::kBFloat16;
}

// ---- Properties --------------------------------------------------------------------------------

Properties::Properties(const std::string& level) : Properties(parse_opt_level(level)) {}
Properties::Properties(const char* level) : Properties(parse_opt_level(level ? level : "")) {}

Properties::Properties(OptLevel level) : opt_level_(level) {
  switch (level) {
    case OptLevel::O0:  // pure FP32
      cast_model_type_ = c10::kFloat;
      master_weights_ = false;
      loss_scale_ = LossScale(1.0);
      break;
    case OptLevel::O1:  // FP32 weights, casts around ops
      patch_torch_functions_ = true;
      break;
    case OptLevel::O2:  // low-precision model, FP32 BatchNorm and masters
      cast_follows_dtype_ = true;
      keep_batchnorm_fp32_ = true;
      master_weights_ = true;
      break;
    case OptLevel::O3:  // pure low precision
      cast_follows_dtype_ = true;
      keep_batchnorm_fp32_ = false;
      master_weights_ = false;
      loss_scale_ = LossScale(1.0);
      break;
  }
}

Properties& Properties::enabled(bool value) {
  enabled_ = value;
  return *this;
}

c10::optional<c10::ScalarType> Properties::cast_model_type() const {
  if (cast_follows_dtype_) return resolved_dtype();
  return cast_model_type_;
}

Properties& Properties::cast_model_type(c10::ScalarType type) {
  TORCH_CHECK(type == c10::kFloat || is_low_precision(type),
              "cast_model_type must be torch::kFloat, torch::kHalf or torch::kBFloat16, got ", c10::toString(type),
              ".");
  TORCH_CHECK(opt_level_ != OptLevel::O1 || type == c10::kFloat,
              "O1 inserts casts around ops and keeps the model's weights in FP32, so cast_model_type must stay "
              "float32 (or unset) with O1; got ",
              c10::toString(type),
              ". To cast the model itself use OptLevel::O2 or O3; to choose O1's autocast dtype use dtype().");
  if (is_low_precision(type)) {
    dtype_ = type;
    cast_follows_dtype_ = true;
    cast_model_type_ = c10::nullopt;
  } else {
    cast_follows_dtype_ = false;
    cast_model_type_ = type;
  }
  return *this;
}

Properties& Properties::cast_model_type(c10::nullopt_t) {
  cast_follows_dtype_ = false;
  cast_model_type_ = c10::nullopt;
  return *this;
}

Properties& Properties::patch_torch_functions(bool value) {
  TORCH_CHECK(!value || opt_level_ == OptLevel::O1,
              "patch_torch_functions=true (autocast around forward) is O1's mechanism and can only be had by "
              "selecting OptLevel::O1; ",
              ampp::to_string(opt_level_), " casts the model instead.");
  patch_torch_functions_ = value;
  return *this;
}

Properties& Properties::keep_batchnorm_fp32(bool value) {
  TORCH_CHECK(opt_level_ != OptLevel::O1,
              "With O1 the model stays FP32 and autocast decides per op, so there is no BatchNorm to keep in FP32: "
              "leave keep_batchnorm_fp32 unset with O1 (it was ",
              value ? "true" : "false", "). Use OptLevel::O2 or O3 to cast the model.");
  keep_batchnorm_fp32_ = value;
  return *this;
}

Properties& Properties::keep_batchnorm_fp32(c10::nullopt_t) {
  keep_batchnorm_fp32_ = c10::nullopt;
  return *this;
}

Properties& Properties::keep_batchnorm_fp32(const std::string& value) {
  TORCH_CHECK(value == "True" || value == "False",
              "keep_batchnorm_fp32 must be a bool, the string \"True\" or \"False\", or unset; got \"", value, "\".");
  return keep_batchnorm_fp32(value == "True");
}

Properties& Properties::keep_batchnorm_fp32(const char* value) {
  return keep_batchnorm_fp32(std::string(value ? value : ""));
}

Properties& Properties::master_weights(bool value) {
  TORCH_CHECK(opt_level_ != OptLevel::O1,
              "master_weights makes no sense with O1: O1 keeps the model's weights in FP32, so they are their own "
              "masters. Leave master_weights unset with O1, or use OptLevel::O2 for a low-precision model with "
              "FP32 master weights.");
  master_weights_ = value;
  return *this;
}

Properties& Properties::master_weights(c10::nullopt_t) {
  master_weights_ = c10::nullopt;
  return *this;
}

Properties& Properties::loss_scale(LossScale value) {
  loss_scale_ = value;
  return *this;
}

Properties& Properties::cast_model_outputs(c10::optional<c10::ScalarType> type) {
  TORCH_CHECK(!type || *type == c10::kFloat || is_low_precision(*type),
              "cast_model_outputs must be torch::kFloat, torch::kHalf, torch::kBFloat16 or unset, got ",
              c10::toString(*type), ".");
  cast_model_outputs_ = type;
  return *this;
}

Properties& Properties::num_losses(int64_t value) {
  TORCH_CHECK(value >= 1, "num_losses must be >= 1 (one loss scaler per loss_id), got ", value, ".");
  num_losses_ = value;
  return *this;
}

Properties& Properties::min_loss_scale(c10::optional<double> value) {
  if (value) {
    TORCH_CHECK(std::isfinite(*value) && *value > 0.0, "min_loss_scale must be a finite number > 0 or unset, got ",
                *value, ".");
    TORCH_CHECK(*value <= max_loss_scale_, "min_loss_scale (", *value, ") must not exceed max_loss_scale (",
                max_loss_scale_, "). Lower min_loss_scale or raise max_loss_scale.");
  }
  min_loss_scale_ = value;
  return *this;
}

Properties& Properties::max_loss_scale(double value) {
  TORCH_CHECK(value > 0.0 && !std::isnan(value), "max_loss_scale must be > 0 (apex default 2^24), got ", value, ".");
  TORCH_CHECK(!min_loss_scale_ || *min_loss_scale_ <= value, "max_loss_scale (", value,
              ") must not be below min_loss_scale (", *min_loss_scale_, ").");
  max_loss_scale_ = value;
  return *this;
}

Properties& Properties::verbosity(int value) {
  TORCH_CHECK(value >= 0, "verbosity must be >= 0, got ", value, ".");
  verbosity_ = value;
  return *this;
}

Properties& Properties::dtype(c10::ScalarType type) {
  TORCH_CHECK(is_low_precision(type),
              "dtype() is the low-precision type and must be torch::kBFloat16 or torch::kHalf, "
              "got ",
              c10::toString(type), ". For pure FP32 training use OptLevel::O0.");
  dtype_ = type;
  return *this;
}

Properties& Properties::emulate_fp16(bool value) {
  emulate_fp16_ = value;
  return *this;
}

Properties& Properties::profile(bool value) {
  profile_ = value;
  return *this;
}

Properties& Properties::device_type(c10::DeviceType type) {
  device_type_ = type;
  return *this;
}

c10::ScalarType Properties::resolved_dtype() const {
  return dtype_ ? *dtype_ : default_low_precision_dtype(device_type_);
}

std::string Properties::to_string() const {
  std::ostringstream os;
  os << "enabled                : " << (enabled_ ? "True" : "False") << "\n"
     << "opt_level              : " << ampp::to_string(opt_level_) << "\n"
     << "cast_model_type        : " << describe(cast_model_type()) << "\n"
     << "patch_torch_functions  : " << (patch_torch_functions_ ? "True" : "False") << "\n"
     << "keep_batchnorm_fp32    : " << describe(keep_batchnorm_fp32_) << "\n"
     << "master_weights         : " << describe(master_weights_) << "\n"
     << "loss_scale             : " << loss_scale_.to_string() << "\n"
     << "dtype (low precision)  : " << c10::toString(resolved_dtype()) << "\n";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Properties& properties) { return os << properties.to_string(); }

}  // namespace ampp
