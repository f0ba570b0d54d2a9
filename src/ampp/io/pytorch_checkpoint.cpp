// PyTorch-format state dicts (pytorch_checkpoint.h); the files themselves: pytorch_file.cpp.
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/util/optimizer_compat.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace ampp {
namespace {

using Dict = c10::impl::GenericDict;

Dict str_keyed_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }
// The public type of the same dict (key str, value Any): no copy.
StateDict typed(const Dict& d) { return c10::impl::toTypedDict<std::string, c10::IValue>(d); }
Dict int_keyed_dict() { return Dict(c10::IntType::get(), c10::AnyType::get()); }

c10::impl::GenericList any_list() { return c10::impl::GenericList(c10::AnyType::get()); }

torch::Tensor cpu_copy(const torch::Tensor& t) {
  if (!t.defined()) return t;
  auto out = at::isFloatingType(t.scalar_type()) ? t.detach().to(torch::kCPU, torch::kFloat) : t.detach().cpu();
  return out.clone().contiguous();
}

// Python's hyperparameters of one group, for the optimizers ampp knows.
void add_group_options(Dict& g, const torch::optim::OptimizerOptions& options) {
  if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    g.insert("lr", o->lr()), g.insert("momentum", o->momentum()), g.insert("dampening", o->dampening());
    g.insert("weight_decay", o->weight_decay()), g.insert("nesterov", o->nesterov());
    g.insert("maximize", false), g.insert("foreach", c10::IValue()), g.insert("differentiable", false);
    g.insert("fused", c10::IValue());
    return;
  }
  auto adam_like = [&g](const auto& o, bool decoupled) {
    g.insert("lr", o.lr());
    g.insert("betas", c10::ivalue::Tuple::create({std::get<0>(o.betas()), std::get<1>(o.betas())}));
    g.insert("eps", o.eps()), g.insert("weight_decay", o.weight_decay()), g.insert("amsgrad", o.amsgrad());
    g.insert("maximize", false), g.insert("foreach", c10::IValue()), g.insert("capturable", false);
    g.insert("differentiable", false), g.insert("fused", c10::IValue());
    g.insert("decoupled_weight_decay", decoupled);
  };
  if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) return adam_like(*o, true);
  if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) return adam_like(*o, false);
  TORCH_CHECK(false, "PyTorch-format optimizer state: only SGD, Adam and AdamW are supported");
}

// Adam's and AdamW's parameter states, which LibTorch declares as two types with the same members.
template <typename AdamState>
void insert_adam_state(Dict& s, const AdamState& adam) {
  s.insert("step", torch::tensor(static_cast<float>(adam.step())));  // PyTorch 2.x: a float32 scalar tensor
  s.insert("exp_avg", cpu_copy(adam.exp_avg())), s.insert("exp_avg_sq", cpu_copy(adam.exp_avg_sq()));
  if (adam.max_exp_avg_sq().defined()) s.insert("max_exp_avg_sq", cpu_copy(adam.max_exp_avg_sq()));
}

// One parameter's state as PyTorch names it; an empty dict when the optimizer has none for it yet.
Dict param_state(const torch::optim::OptimizerParamState& state) {
  Dict s = str_keyed_dict();
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    s.insert("momentum_buffer", cpu_copy(sgd->momentum_buffer()));
  } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    insert_adam_state(s, *adam);
  } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    insert_adam_state(s, *adamw);
  }
  return s;
}

}  // namespace

StateDict make_pytorch_dict() { return make_state_dict(); }

StateDict module_state_dict(const torch::nn::Module& module) {
  Dict d = str_keyed_dict();
  for (const auto& p : module.named_parameters()) d.insert(p.key(), cpu_copy(p.value()));
  for (const auto& b : module.named_buffers()) d.insert(b.key(), cpu_copy(b.value()));
  return typed(d);
}

StateDict optimizer_state_dict(const torch::optim::Optimizer& optimizer) {
  // FusedAdamW counts its steps on the device; AdamWParamState::step is brought up to date here.
  if (const auto* fused = dynamic_cast<const FusedAdamW*>(&optimizer)) fused->sync_step_counts();
  Dict state = int_keyed_dict();
  auto groups = any_list();
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    Dict g = str_keyed_dict();
    add_group_options(g, group.options());
    auto ids = any_list();  // a typed c10::List<int64_t> would pickle as torch.jit._pickle.build_intlist
    for (const auto& p : group.params()) {
      const auto it = optimizer.state().find(optimizer_state_key(p));
      if (it != optimizer.state().end()) state.insert(index, param_state(*it->second));
      ids.push_back(index++);
    }
    g.insert("params", ids);
    groups.push_back(g);
  }
  Dict d = str_keyed_dict();
  d.insert("state", state);
  d.insert("param_groups", groups);
  return typed(d);
}

StateDict scaler_state_dict(const GradScaler& scaler) { return scaler.state_dict(); }

}  // namespace ampp

namespace ampp {
namespace {

std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream s;
  s << "torch.Size(" << sizes << ")";
  return s.str();
}

// Typed reads of loaded values: a wrong type is one line naming the entry, not an IValue assertion.
Dict as_dict(const c10::IValue& v, const char* what) {
  TORCH_CHECK(v.isGenericDict(), what, " must be a dict, got ", v.tagKind());
  return v.toGenericDict();
}

c10::List<c10::IValue> as_list(const c10::IValue& v, const char* what) {
  TORCH_CHECK(v.isList(), what, " must be a list, got ", v.tagKind());
  return v.toList();
}

int64_t as_int(const c10::IValue& v, const char* what) {
  TORCH_CHECK(v.isInt(), what, " must be an int, got ", v.tagKind());
  return v.toInt();
}

const std::string& as_string(const c10::IValue& v, const char* what) {
  TORCH_CHECK(v.isString(), what, " must be a str, got ", v.tagKind());
  return v.toStringRef();
}

// The module's tensors by state-dict key (parameters, then buffers).
std::map<std::string, torch::Tensor> module_tensors(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (auto& p : module.named_parameters()) out[p.key()] = p.value();
  for (auto& b : module.named_buffers()) out[b.key()] = b.value();
  return out;
}

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "\"" : ", \"") + k + "\"";
  return s;
}

}  // namespace

void load_module_state_dict(torch::nn::Module& module, const c10::IValue& state, bool strict) {
  const Dict& dict = as_dict(state, "a module state dict");
  auto tensors = module_tensors(module);
  std::vector<std::string> unexpected, missing, mismatched;
  std::set<std::string> seen;
  for (const auto& item : dict) {
    const std::string key = as_string(item.key(), "a state dict key");
    const auto it = tensors.find(key);
    if (it == tensors.end()) {
      unexpected.push_back(key);
      continue;
    }
    seen.insert(key);
    TORCH_CHECK(item.value().isTensor(), "state dict entry \"", key, "\" is not a tensor");
    const torch::Tensor& saved = item.value().toTensor();
    if (saved.sizes() != it->second.sizes())
      mismatched.push_back(
          fmt::format("size mismatch for {}: copying a param with shape {} from checkpoint, the "
                      "shape in current model is {}.",
                      key, shape_text(saved.sizes()), shape_text(it->second.sizes())));
  }
  for (const auto& [key, tensor] : tensors)
    if (!seen.count(key)) missing.push_back(key);
  std::string errors;
  if (strict && !missing.empty()) errors += "\n\tMissing key(s) in state_dict: " + quoted_list(missing) + ".";
  if (strict && !unexpected.empty()) errors += "\n\tUnexpected key(s) in state_dict: " + quoted_list(unexpected) + ".";
  for (const auto& m : mismatched) errors += "\n\t" + m;
  TORCH_CHECK(errors.empty(), "Error(s) in loading state_dict for ", module.name(), ":", errors,
              strict ? "\n(load_module_state_dict(..., strict=false) skips missing and unexpected keys)" : "");
  torch::NoGradGuard no_grad;
  for (const auto& key : seen) tensors[key].copy_(dict.at(key).toTensor());
}

}  // namespace ampp

namespace ampp {
namespace {

double number(const Dict& d, const char* key) {
  TORCH_CHECK(d.contains(key), "optimizer param group: key \"", key, "\" is missing");
  const c10::IValue& v = d.at(key);
  TORCH_CHECK(v.isDouble() || v.isInt() || v.isBool(), "optimizer param group: \"", key, "\" is not a number");
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.isInt() ? v.toInt() : v.toBool());
}

bool flag(const Dict& d, const char* key) { return d.contains(key) && d.at(key).isBool() && d.at(key).toBool(); }

template <typename Options>
void set_adam_options(Options& o, const Dict& g) {
  TORCH_CHECK(g.contains("betas") && g.at("betas").isTuple() && g.at("betas").toTupleRef().elements().size() == 2,
              "optimizer param group: \"betas\" must be a tuple of two numbers");
  const auto betas = g.at("betas").toTupleRef().elements();
  TORCH_CHECK(betas[0].isDouble() && betas[1].isDouble(), "optimizer param group: \"betas\" must hold two floats");
  o.lr(number(g, "lr")).eps(number(g, "eps")).weight_decay(number(g, "weight_decay")).amsgrad(flag(g, "amsgrad"));
  o.betas(std::make_tuple(betas[0].toDouble(), betas[1].toDouble()));
}

// The saved hyperparameters replace the optimizer's, as PyTorch's load_state_dict does.
void set_group_options(torch::optim::OptimizerOptions& options, const Dict& g) {
  TORCH_CHECK(!flag(g, "maximize"), "optimizer param group: maximize=True has no LibTorch equivalent");
  if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    o->lr(number(g, "lr")).momentum(number(g, "momentum")).dampening(number(g, "dampening"));
    o->weight_decay(number(g, "weight_decay")).nesterov(flag(g, "nesterov"));
  } else if (auto* w = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    set_adam_options(*w, g);
  } else if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    set_adam_options(*a, g);
  } else {
    TORCH_CHECK(false, "PyTorch-format optimizer state: only SGD, Adam and AdamW are supported");
  }
}

torch::Tensor like(const Dict& s, const char* key, const torch::Tensor& param) {
  if (!s.contains(key) || s.at(key).isNone()) return {};
  TORCH_CHECK(s.at(key).isTensor(), "optimizer state: \"", key, "\" is not a tensor");
  const torch::Tensor t = s.at(key).toTensor();
  TORCH_CHECK(t.sizes() == param.sizes(), "optimizer state: \"", key, "\" has shape ", t.sizes(), ", its parameter ",
              param.sizes());
  return t.to(param.options()).clone();
}

int64_t step_count(const Dict& s) {
  TORCH_CHECK(s.contains("step"), "optimizer state: \"step\" is missing");
  const c10::IValue& v = s.at("step");
  TORCH_CHECK((v.isTensor() && v.toTensor().numel() == 1) || v.isDouble() || v.isInt(),
              "optimizer state: \"step\" must be a number, got ", v.tagKind());
  const double step = v.isTensor() ? v.toTensor().item<double>() : v.isInt() ? v.toInt() : v.toDouble();
  TORCH_CHECK(step >= 0 && step <= 9.0e15, "optimizer state: \"step\" is ", step, ", not a step count");
  return static_cast<int64_t>(step);
}

template <typename ParamState>
std::unique_ptr<torch::optim::OptimizerParamState> adam_state(const Dict& s, const torch::Tensor& p) {
  auto state = std::make_unique<ParamState>();
  state->step(step_count(s)).exp_avg(like(s, "exp_avg", p)).exp_avg_sq(like(s, "exp_avg_sq", p));
  state->max_exp_avg_sq(like(s, "max_exp_avg_sq", p));
  return state;
}

std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(const torch::optim::OptimizerOptions& options,
                                                                    const Dict& s, const torch::Tensor& p) {
  if (dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    const auto buffer = like(s, "momentum_buffer", p);
    if (!buffer.defined()) return nullptr;
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(buffer);
    return state;
  }
  if (dynamic_cast<const torch::optim::AdamWOptions*>(&options)) return adam_state<torch::optim::AdamWParamState>(s, p);
  return adam_state<torch::optim::AdamParamState>(s, p);
}

}  // namespace

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state) {
  const Dict& d = as_dict(state, "an optimizer state dict");
  TORCH_CHECK(d.contains("state") && d.contains("param_groups"),
              "an optimizer state dict has the keys \"state\" and \"param_groups\"");
  const auto groups = as_list(d.at("param_groups"), "\"param_groups\"");
  auto& ours = optimizer.param_groups();
  TORCH_CHECK(groups.size() == ours.size(), "loaded state dict has ", groups.size(),
              " parameter group(s); the optimizer has ", ours.size());
  std::map<int64_t, std::pair<torch::Tensor, torch::optim::OptimizerOptions*>> by_index;
  for (size_t gi = 0; gi < ours.size(); ++gi) {
    const Dict& g = as_dict(groups.get(gi), "a parameter group");
    TORCH_CHECK(g.contains("params"), "optimizer param group ", gi, ": key \"params\" is missing");
    const auto ids = as_list(g.at("params"), "a param group's \"params\"");
    TORCH_CHECK(ids.size() == ours[gi].params().size(), "loaded parameter group ", gi, " has ", ids.size(),
                " parameters; the optimizer's has ", ours[gi].params().size());
    set_group_options(ours[gi].options(), g);
    for (size_t i = 0; i < ids.size(); ++i)
      by_index[as_int(ids.get(i), "a parameter index")] = {ours[gi].params()[i], &ours[gi].options()};
  }
  optimizer.state().clear();
  for (const auto& item : as_dict(d.at("state"), "\"state\"")) {
    const int64_t index = as_int(item.key(), "an optimizer state key");
    const auto it = by_index.find(index);
    TORCH_CHECK(it != by_index.end(), "optimizer state for parameter ", index, ", which no group lists");
    const auto& [param, options] = it->second;
    auto param_state = make_param_state(*options, as_dict(item.value(), "a parameter's state"), param);
    if (param_state) optimizer.state()[optimizer_state_key(param)] = std::move(param_state);
  }
}

StateDict to_state_dict(const c10::IValue& value, const std::string& what) {
  StateDict sd;
  for (const auto& item : as_dict(value, what.c_str()))
    sd.insert_or_assign(as_string(item.key(), (what + " key").c_str()), item.value());
  return sd;
}

void load_scaler_state_dict(GradScaler& scaler, const c10::IValue& state) {
  scaler.load_state_dict(to_state_dict(state, "a GradScaler state dict"));
}

}  // namespace ampp
