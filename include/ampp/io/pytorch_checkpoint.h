#pragma once
// Checkpoints in PyTorch's own format: files that plain `torch.load(path)` opens in Python (with its
// default weights_only=True, no ampp code), holding state dicts with PyTorch's names and layouts, and
// the reverse: state dicts from files Python's torch.save wrote, loaded into LibTorch modules and
// optimizers and ampp's GradScaler with strict checks. Written with LibTorch's own pickler.
//
//   auto ckpt = ampp::make_pytorch_dict();
//   ckpt.insert("model", ampp::module_state_dict(*model));
//   ckpt.insert("optimizer", ampp::optimizer_state_dict(optimizer));
//   ckpt.insert("scaler", ampp::scaler_state_dict(scaler));
//   ckpt.insert("epoch", epoch);
//   ampp::save_pytorch(ckpt, "run.pt");
//   # Python: ckpt = torch.load("run.pt"); model.load_state_dict(ckpt["model"]); ...
//
//   auto loaded = ampp::load_pytorch("run.pt").toGenericDict();
//   ampp::load_module_state_dict(*model, loaded.at("model"));   // strict, as load_state_dict(strict=True)
//
// Layouts: the module's parameters and buffers by module path (as torch.nn's state_dict() of the same
// structure), in float32 for floating tensors (bf16/fp16 widen exactly); optimizer.state_dict() of
// torch.optim.SGD, Adam or AdamW ({"state": {index: {...}}, "param_groups": [{..., "params": [index,
// ...]}]}, parameters numbered in order); GradScaler.state_dict()'s five keys (plus ampp's counters,
// which PyTorch ignores). See docs/training.md.
#include <ampp/scaling/grad_scaler.h>
#include <ampp/util/state_dict.h>

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

namespace ampp {

/// An empty state dict (util/state_dict.h), for a checkpoint's top level.
StateDict make_pytorch_dict();

/// torch.nn.Module.state_dict() of `module`: every parameter and buffer by module path; floating
/// tensors as float32 copies, others (BatchNorm's num_batches_tracked) as they are.
StateDict module_state_dict(const torch::nn::Module& module);

/// torch.optim's state_dict() of an SGD, Adam or AdamW optimizer (other types: an error naming them).
StateDict optimizer_state_dict(const torch::optim::Optimizer& optimizer);

/// GradScaler.state_dict(): "scale", "growth_factor", "backoff_factor" (float), "growth_interval",
/// "_growth_tracker" (int), plus "_ampp_*" counters.
StateDict scaler_state_dict(const GradScaler& scaler);

/// Writes `object` as torch.save does (zip container, pickle protocol 2, tensors as storages), without
/// TorchScript's type tags, which weights_only loading refuses. Atomic: the file is whole or absent.
void save_pytorch(const c10::IValue& object, const std::string& path);

/// Reads a file written by torch.save (zip format, PyTorch >= 1.6) or save_pytorch.
c10::IValue load_pytorch(const std::string& path);

/// module.load_state_dict(state, strict): missing and unexpected keys (strict only) and shape
/// mismatches are one error listing them all, as PyTorch's; values are converted to each tensor's dtype.
void load_module_state_dict(torch::nn::Module& module, const c10::IValue& state, bool strict = true);

/// optimizer.load_state_dict(state): the saved hyperparameters replace the optimizer's (as in PyTorch),
/// and each parameter's state is restored; the group and parameter counts must match.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state);

/// A dict read from a file (untrusted) as a StateDict: a one-line error naming `what` unless `value` is a dict
/// with str keys.
StateDict to_state_dict(const c10::IValue& value, const std::string& what);

/// GradScaler.load_state_dict(state) from PyTorch's keys.
void load_scaler_state_dict(GradScaler& scaler, const c10::IValue& state);

}  // namespace ampp
