#include <ampp/util/optimizer_compat.h>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace ampp {

bool for_each_state_tensor(torch::optim::OptimizerParamState& state, const std::function<void(torch::Tensor&)>& visit) {
  namespace optim = torch::optim;
  if (auto* s = dynamic_cast<optim::SGDParamState*>(&state)) {
    visit(s->momentum_buffer());
  } else if (auto* s = dynamic_cast<optim::AdamParamState*>(&state)) {
    for (auto* t : {&s->exp_avg(), &s->exp_avg_sq(), &s->max_exp_avg_sq()}) visit(*t);
  } else if (auto* s = dynamic_cast<optim::AdamWParamState*>(&state)) {
    for (auto* t : {&s->exp_avg(), &s->exp_avg_sq(), &s->max_exp_avg_sq()}) visit(*t);
  } else if (auto* s = dynamic_cast<optim::RMSpropParamState*>(&state)) {
    for (auto* t : {&s->square_avg(), &s->momentum_buffer(), &s->grad_avg()}) visit(*t);
  } else if (auto* s = dynamic_cast<optim::AdagradParamState*>(&state)) {
    visit(s->sum());
  } else {
    return false;
  }
  return true;
}

}  // namespace ampp
