#include "optimizer_state.h"

#include <c10/util/Type.h>

namespace ampp::detail {
namespace {

torch::Tensor cast(const torch::Tensor& t, c10::ScalarType dtype) {
  return t.defined() && t.is_floating_point() ? t.to(dtype) : t;
}

// Unknown state types are refused rather than left in the wrong dtype.
void cast_state(torch::optim::OptimizerParamState& state, c10::ScalarType dtype) {
  const bool known = for_each_state_tensor(state, [&](torch::Tensor& t) { t = cast(t, dtype); });
  TORCH_CHECK(known, "ampp::initialize: the optimizer already has state of type ", c10::demangle(typeid(state).name()),
              " for a parameter it must convert, and ampp does not know that state type. Call "
              "ampp::initialize() before the optimizer's first step() (and load optimizer checkpoints after it).");
}

}  // namespace

void move_param_state(torch::optim::Optimizer& optimizer, const torch::Tensor& from, const torch::Tensor& to) {
  auto& states = optimizer.state();
  auto it = states.find(state_key(from));
  if (it == states.end()) return;
  std::unique_ptr<torch::optim::OptimizerParamState> state = std::move(it->second);
  states.erase(it);
  cast_state(*state, to.scalar_type());
  states[state_key(to)] = std::move(state);
}

void cast_param_state(torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  auto& states = optimizer.state();
  auto it = states.find(state_key(param));
  if (it != states.end()) cast_state(*it->second, param.scalar_type());
}

}  // namespace ampp::detail
