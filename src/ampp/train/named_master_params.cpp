// named_master_params (named_master_params.h).
#include <ampp/train/named_master_params.h>

#include <c10/util/Exception.h>

#include <map>

namespace ampp::train {

std::vector<std::pair<std::string, torch::Tensor>> named_master_params(const torch::nn::Module& model, const Amp& amp) {
  const auto named = model.named_parameters();
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& p : named) names.emplace(p.value().unsafeGetTensorImpl(), p.key());
  const auto masters = amp.master_params();
  const auto owners = amp.model_params_of_masters();
  TORCH_INTERNAL_ASSERT(named.size() == masters.size(), "one master per model parameter");
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < masters.size(); ++i) {
    const auto name = names.find(owners[i].unsafeGetTensorImpl());
    if (name == names.end()) break;
    out.emplace_back(name->second, masters[i]);
  }
  if (out.size() == masters.size()) return out;
  // Masters of parameters that are not this module's (FSDP's shards, while the whole model is gathered to be
  // saved): the module's names in its order, with values the caller takes from the gathered module
  // (TrainingObjects::masters), not from these shards, which AdamW's groups put in another order.
  out.clear();
  for (size_t i = 0; i < masters.size(); ++i) out.emplace_back(named[i].key(), masters[i]);
  return out;
}

}  // namespace ampp::train
