// Float8Linear and convert_to_float8_training (float8_linear.h).
#include <ampp/precision/float8_linear.h>
#include <ampp/precision/float8_ranges.h>

#include <c10/util/Exception.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <ostream>

namespace ampp {

Float8LinearImpl::Float8LinearImpl(const Float8LinearOptions& options_) : options(options_) { reset(); }

void Float8LinearImpl::reset() {
  TORCH_CHECK(options.in_features() >= 0 && options.out_features() >= 0,
              "ampp::Float8Linear: in_features and out_features must be >= 0, got ", options.in_features(), " and ",
              options.out_features());
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  bias = register_parameter("bias", torch::empty(options.out_features()), /*requires_grad=*/options.bias());
  if (!options.bias()) bias = register_parameter("bias", torch::Tensor(), false);
  delayed_ = {};
  if (float8_ && float8_->recipe() == Float8Recipe::kDelayed) register_delayed_state();  // a clone's
  reset_parameters();
}

void Float8LinearImpl::register_delayed_state() {
  const auto state = make_float8_delayed_state(float8_->amax_history_len(), weight.device());
  delayed_.amax_history = register_buffer("fp8_amax_history", state.amax_history);
  delayed_.scale = register_buffer("fp8_scale", state.scale);
}

void Float8LinearImpl::set_float8(std::optional<Float8LinearConfig> config) {
  const bool delayed = config && config->recipe() == Float8Recipe::kDelayed;
  if (delayed_.amax_history.defined()) {
    TORCH_CHECK(delayed && config->amax_history_len() == delayed_.amax_history.size(0),
                "ampp::Float8Linear: this layer holds the delayed recipe's state (", delayed_.amax_history.size(0),
                " passes of amax history) in its buffers; it keeps that recipe and length. Build a new layer for "
                "another recipe");
  }
  float8_ = config;
  if (delayed && !delayed_.amax_history.defined()) register_delayed_state();
}

// torch::nn::LinearImpl::reset_parameters, draw for draw, so that a model seeded alike starts alike.
void Float8LinearImpl::reset_parameters() {
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (!bias.defined()) return;
  const auto [fan_in, fan_out] = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  torch::nn::init::uniform_(bias, -bound, bound);
}

void Float8LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "ampp::Float8Linear(in_features=" << options.in_features() << ", out_features=" << options.out_features()
         << ", bias=" << (options.bias() ? "true" : "false")
         << ", fp8=" << (float8_ ? to_string(float8_->recipe()) : std::string("off")) << ")";
}

torch::Tensor Float8LinearImpl::forward(const torch::Tensor& input) {
  if (!float8_) return torch::nn::functional::linear(input, weight, bias);
  const detail::Float8LayerScope named(layer_name_);
  if (float8_->recipe() == Float8Recipe::kDelayed)
    return float8_delayed_linear(input, weight, bias, *float8_, delayed_, is_training());
  return float8_linear(input, weight, bias, *float8_);
}

namespace {

// (in, out) features of a Linear of either kind; nullopt for any other module.
std::optional<std::pair<int64_t, int64_t>> linear_features(const torch::nn::Module& m) {
  if (const auto* f = m.as<Float8LinearImpl>()) return std::pair{f->options.in_features(), f->options.out_features()};
  if (const auto* l = m.as<torch::nn::LinearImpl>())
    return std::pair{l->options.in_features(), l->options.out_features()};
  return std::nullopt;
}

bool fits_fp8_kernels(int64_t in_features, int64_t out_features) {
  return in_features % 16 == 0 && out_features % 16 == 0;
}

}  // namespace

Float8ModuleFilter fits_fp8_kernels_filter() {
  return [](const torch::nn::Module& layer, const std::string&) {
    const auto features = linear_features(layer);
    return features && fits_fp8_kernels(features->first, features->second);
  };
}

Float8ModuleFilter auto_filter_for_recipe(Float8Recipe recipe, std::vector<std::string> skip_fqns) {
  return [recipe, skip_fqns = std::move(skip_fqns)](const torch::nn::Module& layer, const std::string& fqn) {
    const auto features = linear_features(layer);
    if (!features) return false;
    for (const auto& skip : skip_fqns)
      if (fqn.find(skip) != std::string::npos) return false;
    const auto [k, n] = *features;
    if (!fits_fp8_kernels(k, n)) return false;
    if (recipe == Float8Recipe::kRowwise) return !(n <= 2048 || k <= 1024 || (n <= 4096 && k <= 2048));
    return !(k <= 4096 && n <= 1024);  // tensorwise's, and delayed's: the same per-tensor products
  };
}

std::vector<std::string> convert_to_float8_training(torch::nn::Module& root, const Float8LinearConfig& config,
                                                    const Float8ModuleFilter& filter) {
  std::vector<std::string> converted;
  auto convert = [&](torch::nn::Module& module, const std::string& fqn) {
    if (!linear_features(module) || (filter && !filter(module, fqn))) return;
    auto* layer = module.as<Float8LinearImpl>();
    TORCH_CHECK(layer, "ampp::convert_to_float8_training: '", fqn,
                "' is a torch::nn::Linear, which cannot be swapped in LibTorch (a module calls its children by "
                "their own type); build it as ampp::Float8Linear, which has the same parameters and names");
    layer->set_float8(config);
    layer->set_layer_name(fqn);
    converted.push_back(fqn);
  };
  convert(root, "");  // the root itself, which need not live in a shared_ptr
  for (const auto& item : root.named_modules("", /*include_self=*/false)) convert(*item.value(), item.key());
  return converted;
}

}  // namespace ampp
