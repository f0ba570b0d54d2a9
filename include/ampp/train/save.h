#pragma once
// A checkpoint of a training loop in one call each way, as Python's torch.save({...}) and torch.load:
//
//   ampp::save("run.pt", {{"model", model}, {"optimizer", optimizer}, {"scaler", scaler}, {"epoch", epoch}});
//   ...
//   ampp::load("run.pt", {{"model", model}, {"optimizer", optimizer}, {"scaler", scaler}, {"epoch", epoch}});
//
// Each entry names a live object: a module (a holder such as torch::nn::Linear, a std::shared_ptr<Net>, a
// Module&, or the module a DistributedDataParallel wraps), an optimizer (SGD, Adam, AdamW and ampp's fused
// ones), a GradScaler, an Amp (ampp::initialize's handle: loss scalers and, under O2, the FP32 masters), a
// StateDict of one's own, or a variable (int, int64_t, double, bool, std::string, torch::Tensor). save()
// writes each one's state_dict() and load() loads into each one, in the order given (under O2: the model
// before the Amp, as apex's order is).
//
// The file is PyTorch's format, written atomically (whole or absent): Python opens it with
// torch.load(path) (weights_only=True) and resumes with model.load_state_dict(ckpt["model"]),
// optimizer.load_state_dict(ckpt["optimizer"]), scaler.load_state_dict(ckpt["scaler"]). It is read back
// through ampp's hardened reader (untrusted bytes: bounds and types checked, no code run). A round trip
// is bit for bit: floating weights are stored as float32, which holds bf16 and fp16 exactly.
//
// With a default process group (ampp::dist::init_process_group), only its rank 0 writes and save() returns
// at once on the others; every rank reads. save() is no collective, so `if (rank == 0) ampp::save(...)`
// works too; a rank that is to load what rank 0 has just saved waits for it first (group.barrier()).
#include <ampp/amp/amp.h>
#include <ampp/dist/ddp.h>
#include <ampp/scaling/grad_scaler.h>
#include <ampp/util/state_dict.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace ampp {

/// One named entry of save() and load(): how to take the state of a live object and how to put it back.
class CheckpointEntry {
 public:
  CheckpointEntry(torch::nn::Module& module);  // NOLINT(google-explicit-constructor): {"model", model}
  template <class M>
  CheckpointEntry(torch::nn::ModuleHolder<M>& module) : CheckpointEntry(static_cast<torch::nn::Module&>(*module)) {}
  template <class M, class = std::enable_if_t<std::is_base_of_v<torch::nn::Module, M>>>
  CheckpointEntry(const std::shared_ptr<M>& module) : CheckpointEntry(static_cast<torch::nn::Module&>(*module)) {}
  /// The wrapped module's state, without DDP's "module." prefix: the file loads into a plain model.
  template <class H>
  CheckpointEntry(dist::DistributedDataParallel<H>& ddp) : CheckpointEntry(ddp.module()) {}
  CheckpointEntry(torch::optim::Optimizer& optimizer);
  CheckpointEntry(GradScaler& scaler);
  CheckpointEntry(Amp& amp);
  CheckpointEntry(StateDict& dict);
  CheckpointEntry(int64_t& value);
  CheckpointEntry(int& value);
  CheckpointEntry(double& value);
  CheckpointEntry(bool& value);
  CheckpointEntry(std::string& value);
  /// Saved as a CPU copy; loaded onto the device the variable's tensor is on (the CPU when undefined).
  CheckpointEntry(torch::Tensor& value);

  using Save = std::function<c10::IValue()>;
  using Load = std::function<void(const c10::IValue&)>;

  c10::IValue state() const { return save_(); }
  /// Loads `state` (a value read from a file: untrusted) into the object; errors are c10::Errors.
  void load(const c10::IValue& state) const { load_(state); }

 private:
  explicit CheckpointEntry(std::pair<Save, Load> functions)
      : save_(std::move(functions.first)), load_(std::move(functions.second)) {}
  Save save_;
  Load load_;
};

using CheckpointEntries = std::initializer_list<std::pair<std::string, CheckpointEntry>>;

/// Writes {name: state} of every entry to `path` as torch.save would (see above); on rank 0 only when a
/// default process group exists. Names must be distinct and not empty.
void save(const std::string& path, CheckpointEntries entries);

/// Loads `path` into every entry. A name the file lacks, or a state that does not fit its object, is one
/// error naming the file and the entry; names in the file that no entry asks for are left alone.
void load(const std::string& path, CheckpointEntries entries);

}  // namespace ampp
