// A training run in PyTorch's checkpoint format (pytorch_training_checkpoint.h).
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/train/named_master_params.h>
#include <ampp/train/pytorch_training_checkpoint.h>

#include <map>

namespace ampp::train {
namespace {

int64_t count_entry(const c10::impl::GenericDict& ckpt, const std::string& key, const std::string& path) {
  if (!ckpt.contains(key)) return 0;
  const auto& v = ckpt.at(key);
  TORCH_CHECK(v.isInt() && v.toInt() >= 0, "PyTorch checkpoint '", path, "': \"", key,
              "\" must be a non-negative int, got ", v.tagKind());
  return v.toInt();
}

bool uses_masters(const Amp& amp) { return amp.properties().master_weights().value_or(false); }

// This run's amp state with the file's values: the loss scale and growth tracker of
// GradScaler.state_dict() when the run scales its loss, and under O2 the masters from the file's float32
// values (the model then holds them rounded). Sets `scaler_loaded`.
StateDict amp_state(const c10::impl::GenericDict& scaler, const c10::impl::GenericDict& model_state,
                    const TrainingObjects& objects, bool& scaler_loaded) {
  StateDict state = objects.amp.state_dict();
  scaler_loaded = scaler.contains("scale") && objects.amp.checks_overflow() && state.contains("loss_scaler0");
  if (scaler_loaded) {
    auto entry = state.at("loss_scaler0").toGenericDict();
    entry.insert_or_assign("loss_scale", state_number(scaler.at("scale"), "scale"));
    entry.insert_or_assign("unskipped", scaler.contains("_growth_tracker")
                                            ? state_count(scaler.at("_growth_tracker"), "_growth_tracker")
                                            : 0);
  }
  if (uses_masters(objects.amp)) {
    // Only the parameters with a master of their own (BatchNorm's stay FP32 and are their own master,
    // already loaded with the model), in the optimizer's order, as Amp::state_dict() lists them.
    const auto params = objects.model.named_parameters();
    std::vector<torch::Tensor> masters;
    for (const auto& [name, master] : named_master_params(objects.model, objects.amp))
      if (!master.is_same(params[name])) masters.push_back(model_state.at(name).toTensor().to(master.scalar_type()));
    state.insert_or_assign("master_params", masters);
  }
  return state;
}

}  // namespace

void save_pytorch_training_checkpoint(const std::string& path, const TrainingObjects& objects,
                                      const RunPosition& position) {
  auto model = module_state_dict(objects.model);
  // The optimizer steps the masters (O2) or the parameters themselves: their values are the run's.
  const auto named = named_master_params(objects.model, objects.amp);
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& master = objects.masters.empty() ? named[i].second : objects.masters[i];
    model.insert_or_assign(named[i].first, master.detach().to(torch::kCPU, torch::kFloat).clone());
  }
  auto ckpt = make_pytorch_dict();
  ckpt.insert("model", model);
  ckpt.insert("optimizer", optimizer_state_dict(objects.optimizer));
  ckpt.insert("scaler", scaler_state_dict(objects.amp.scaler()));
  ckpt.insert("epoch", position.epoch);
  ckpt.insert("batch", position.batch);
  ckpt.insert("step", position.global_step);
  save_pytorch(ckpt, path);
}

PyTorchCheckpointContents load_pytorch_training_checkpoint(const std::string& path, const TrainingObjects& objects) {
  const c10::IValue file = load_pytorch(path);
  TORCH_CHECK(file.isGenericDict(), "PyTorch checkpoint '", path, "' holds a ", file.tagKind(),
              ", not a dict: save a model's state_dict() or a dict with \"model\", \"optimizer\", \"scaler\"");
  const auto ckpt = file.toGenericDict();
  PyTorchCheckpointContents c;
  c.weights_only = !(ckpt.contains("model") && ckpt.at("model").isGenericDict());
  const auto model_state = c.weights_only ? ckpt : ckpt.at("model").toGenericDict();
  torch::NoGradGuard no_grad;
  load_module_state_dict(objects.model, model_state);  // strict
  const auto scaler = !c.weights_only && ckpt.contains("scaler") && ckpt.at("scaler").isGenericDict()
                          ? ckpt.at("scaler").toGenericDict()
                          : c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  objects.amp.load_state_dict(amp_state(scaler, model_state, objects, c.scaler));
  if (c.weights_only) return c;
  if (ckpt.contains("optimizer")) {
    load_optimizer_state_dict(objects.optimizer, ckpt.at("optimizer"));
    c.optimizer = true;
  }
  c.epoch = count_entry(ckpt, "epoch", path);
  c.batch = count_entry(ckpt, "batch", path);
  c.step = count_entry(ckpt, "step", path);
  c.skipped_steps =
      scaler.contains("_ampp_skipped_steps") ? state_count(scaler.at("_ampp_skipped_steps"), "_ampp_skipped_steps") : 0;
  return c;
}

}  // namespace ampp::train
