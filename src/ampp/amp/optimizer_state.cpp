#include "optimizer_state.h"

#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace ampp::detail {
namespace {

torch::Tensor cast(const torch::Tensor& t, c10::ScalarType dtype) {
  return t.defined() && t.is_floating_point() ? t.to(dtype) : t;
}

// LibTorch keeps per-parameter state in typed structs without a generic tensor list, so each known
// optimizer is handled by name. Unknown state types are refused rather than left in the wrong dtype.
void cast_state(torch::optim::OptimizerParamState& state, c10::ScalarType dtype) {
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    s->momentum_buffer(cast(s->momentum_buffer(), dtype));
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    s->exp_avg(cast(s->exp_avg(), dtype)).exp_avg_sq(cast(s->exp_avg_sq(), dtype));
    s->max_exp_avg_sq(cast(s->max_exp_avg_sq(), dtype));
  } else if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    s->exp_avg(cast(s->exp_avg(), dtype)).exp_avg_sq(cast(s->exp_avg_sq(), dtype));
    s->max_exp_avg_sq(cast(s->max_exp_avg_sq(), dtype));
  } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(&state)) {
    s->square_avg(cast(s->square_avg(), dtype)).momentum_buffer(cast(s->momentum_buffer(), dtype));
    s->grad_avg(cast(s->grad_avg(), dtype));
  } else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(&state)) {
    s->sum(cast(s->sum(), dtype));
  } else {
    TORCH_CHECK(false, "ampp::initialize: the optimizer already has state of type ",
                c10::demangle(typeid(state).name()),
                " for a parameter it must convert, and ampp does not know that state type. Call "
                "ampp::initialize() before the optimizer's first step() (and load optimizer checkpoints after it).");
  }
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
