#pragma once
// A Linear whose products can run in fp8 (float8.h), and torchao's convert_to_float8_training for it.
//
//   struct Block : torch::nn::Module {
//     ampp::Float8Linear fc{ampp::Float8LinearOptions(768, 3072)};   // a Linear until converted
//     ...
//   };
//   ampp::convert_to_float8_training(*model, ampp::Float8LinearConfig(),
//                                    ampp::auto_filter_for_recipe(ampp::Float8Recipe::kTensorwise));
//
// Python swaps each nn.Linear for a Float8Linear. A LibTorch module calls its children through their
// static types, so a torch::nn::Linear cannot be swapped from outside: the layers that may run in fp8 are
// built as ampp::Float8Linear, which has torch::nn::Linear's parameters (weight [out, in], bias [out]),
// names and initialisation, so state dicts and checkpoints do not change, and computes F.linear until
// converted.
//
// Converted to the delayed recipe, a layer also holds its scaling state (float8_delayed.h) as two float32
// buffers, so that state dicts and checkpoints carry it: "fp8_amax_history" [amax_history_len, 3] and
// "fp8_scale" [3]. It records in training mode only; in eval mode it casts with the scales the next training
// pass would use and leaves the state as it was.
#include <ampp/precision/float8.h>
#include <ampp/precision/float8_delayed.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ampp {

struct Float8LinearOptions {
  Float8LinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
};

class Float8LinearImpl : public torch::nn::Cloneable<Float8LinearImpl> {
 public:
  Float8LinearImpl(int64_t in_features, int64_t out_features)
      : Float8LinearImpl(Float8LinearOptions(in_features, out_features)) {}
  explicit Float8LinearImpl(const Float8LinearOptions& options);

  void reset() override;
  void reset_parameters();  // torch::nn::Linear's: kaiming_uniform(a = sqrt(5)) weight, uniform bias
  void pretty_print(std::ostream& stream) const override;

  // F.linear, or the recipe's fp8 products once converted (set_float8).
  torch::Tensor forward(const torch::Tensor& input);

  // The recipe its products run in from now on; nullopt: plain F.linear again. The delayed recipe registers
  // its state's buffers; once it has, only the delayed recipe with the same amax_history_len may follow.
  void set_float8(std::optional<Float8LinearConfig> config);
  const std::optional<Float8LinearConfig>& float8() const { return float8_; }
  // Its path in the model, for the fp8 doctor (float8_ranges.h); convert_to_float8_training sets it.
  void set_layer_name(std::string name) { layer_name_ = std::move(name); }
  // The delayed recipe's state (its buffers); undefined tensors under another recipe.
  const Float8DelayedState& delayed_state() const { return delayed_; }

  Float8LinearOptions options;
  torch::Tensor weight, bias;

 private:
  void register_delayed_state();

  std::optional<Float8LinearConfig> float8_;
  Float8DelayedState delayed_;
  std::string layer_name_;
};
TORCH_MODULE(Float8Linear);

// Which Linear layers convert, as torchao's module_filter_fn: (the layer, a Float8Linear or a
// torch::nn::Linear, and its dotted path in the root, "" for the root itself) -> convert it.
using Float8ModuleFilter = std::function<bool(const torch::nn::Module& linear, const std::string& fqn)>;

// Every Linear whose in and out features are multiples of 16 (the GPU's fp8 kernels need them), whatever
// its shape: the first test of auto_filter_for_recipe, alone.
Float8ModuleFilter fits_fp8_kernels_filter();

// torchao's _auto_filter_for_recipe: no layer whose path contains one of `skip_fqns`, none whose in or out
// features are not multiples of 16 (the GPU's fp8 kernels need them), and only the shapes where fp8 pays on
// an H100 (torchao's measurements; K = in, N = out features): tensorwise skips K <= 4096 with N <= 1024;
// rowwise skips N <= 2048, K <= 1024, and N <= 4096 with K <= 2048. The delayed recipe takes tensorwise's
// rule: its products are the same per-tensor ones (with one read of each tensor less).
Float8ModuleFilter auto_filter_for_recipe(Float8Recipe recipe, std::vector<std::string> skip_fqns = {});

// Every Float8Linear in `root` (the root included) that `filter` accepts (nullptr: all) runs its products
// in fp8 with `config` from now on. Returns the converted layers' paths. A torch::nn::Linear that the filter
// accepts is an error naming it (it cannot be swapped: build it as ampp::Float8Linear).
std::vector<std::string> convert_to_float8_training(torch::nn::Module& root, const Float8LinearConfig& config = {},
                                                    const Float8ModuleFilter& filter = nullptr);

}  // namespace ampp
