// NonFiniteLocator: a thread-local RecordFunction callback that checks every op's outputs, and on the
// first non-finite one whose inputs were all finite, records where it happened.
//
// The callback is thread-local, so only this thread's ops are seen, and those of the threads LibTorch hands
// this thread's state to: autograd's worker threads, which run a CUDA backward. The state it records into is
// therefore not thread-local (a thread_local pointer was null on the worker thread, and a GPU's backward ops
// went unseen): one locator per process, its state behind a recursive mutex (the checks run ops, which call
// back on the same thread).

#include <ampp/precision/nonfinite_locator.h>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace ampp {

// An op in progress. LibTorch lets a callback read the inputs only when the op starts, so their
// finiteness is decided then (an in-place op's output is its input) and the tensors kept for the ranges.
struct OpenOp {
  std::string name;
  int64_t index = 0;
  std::vector<at::Tensor> inputs;
  bool inputs_finite = true;
  std::string module;  // the module whose parameter is among the inputs ("" if none)
};

struct NonFiniteLocator::State {
  std::recursive_mutex mutex;
  std::vector<OpenOp> open;
  int64_t seen = 0;
  std::optional<NonFiniteOrigin> first;
  bool checking = false;                                           // the checks run ops too: those are not observed
  std::unordered_map<const c10::TensorImpl*, std::string> owners;  // parameter -> its module's path
  std::string last_module;                                         // the latest module whose parameters an op took
};

namespace {

std::atomic<NonFiniteLocator::State*> current{nullptr};

bool is_float_tensor(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && at::isFloatingType(v.toTensor().scalar_type());
}

// Every floating tensor among `values`, including the elements of tensor lists.
std::vector<at::Tensor> float_tensors(c10::ArrayRef<const c10::IValue> values) {
  std::vector<at::Tensor> out;
  for (const auto& v : values) {
    if (is_float_tensor(v)) out.push_back(v.toTensor());
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector())
        if (t.defined() && at::isFloatingType(t.scalar_type())) out.push_back(t);
  }
  return out;
}

bool all_finite(const at::Tensor& t) { return t.numel() == 0 || at::isfinite(t).all().item<bool>(); }

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << c10::toString(t.scalar_type()) << " " << t.sizes();
  return s.str();
}

std::string range_of(const at::Tensor& t) {
  if (t.numel() == 0) return shape_of(t) + " (empty)";
  const at::Tensor f = t.to(at::kDouble);
  return c10::str(shape_of(t), " in [", f.min().item<double>(), ", ", f.max().item<double>(), "]");
}

std::string non_finite_count(const at::Tensor& t) {
  const int64_t inf = at::isinf(t).sum().item<int64_t>(), nan = at::isnan(t).sum().item<int64_t>();
  return c10::str(shape_of(t), ": ", inf, " inf, ", nan, " NaN of ", t.numel());
}

// empty*, new_empty* and resize_ return uninitialized memory, which may hold any bit pattern.
bool returns_uninitialized(const std::string& name) {
  return name.rfind("aten::empty", 0) == 0 || name.rfind("aten::new_empty", 0) == 0 || name == "aten::resize_";
}

// "fc2" for the innermost open op that took a parameter of fc2; else "after <the last such module>".
std::string module_of(const NonFiniteLocator::State& st) {
  for (auto op = st.open.rbegin(); op != st.open.rend(); ++op)
    if (!op->module.empty()) return op->module;
  return st.last_module.empty() ? std::string() : "after " + st.last_module;
}

// The op that just ended (the innermost open one): is it where a non-finite value was born?
void check_ended_op(NonFiniteLocator::State& st, const at::RecordFunction& fn) {
  const OpenOp& op = st.open.back();
  if (!op.inputs_finite || returns_uninitialized(op.name)) return;  // carried in, or not values yet
  const auto outputs = float_tensors(c10::ArrayRef<const c10::IValue>(fn.outputs().data(), fn.outputs().size()));
  for (const auto& out : outputs) {
    if (all_finite(out)) continue;
    NonFiniteOrigin origin;
    for (const auto& open : st.open) origin.ops.push_back(open.name);
    origin.op_index = op.index;
    for (const auto& in : op.inputs) origin.inputs.push_back(range_of(in));
    origin.output = non_finite_count(out);
    origin.module = module_of(st);
    st.first = std::move(origin);
    return;
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  NonFiniteLocator::State* st = current.load();
  if (st == nullptr) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(st->mutex);
  if (st->checking) return nullptr;
  OpenOp op{fn.name(), ++st->seen, {}, true, {}};
  if (!st->first) {  // after the first finding nothing more is checked
    st->checking = true;
    try {
      op.inputs = float_tensors(fn.inputs());
      // copy_ overwrites its destination: only the source's values go in (a narrowing copy, e.g.
      // float32 80000 into fp16, is where an overflow is born).
      if (op.name == "aten::copy_" && !op.inputs.empty()) op.inputs.erase(op.inputs.begin());
      for (const auto& in : op.inputs) {
        op.inputs_finite = op.inputs_finite && all_finite(in);
        const auto owner = st->owners.find(in.unsafeGetTensorImpl());
        if (owner != st->owners.end()) op.module = st->last_module = owner->second;
      }
    } catch (...) {  // a check that cannot run on these values must not break the user's forward
      op.inputs_finite = false;
    }
    st->checking = false;
  }
  st->open.push_back(std::move(op));
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* /*unused*/) {
  NonFiniteLocator::State* st = current.load();
  if (st == nullptr) return;
  std::lock_guard<std::recursive_mutex> lock(st->mutex);
  if (st->checking || st->open.empty()) return;
  if (!st->first) {
    st->checking = true;
    try {
      check_ended_op(*st, fn);
    } catch (...) {  // a check that cannot run on this op's values must not break the user's forward
    }
    st->checking = false;
  }
  st->open.pop_back();
}

}  // namespace

std::string NonFiniteOrigin::describe() const {
  std::ostringstream s;
  s << "first non-finite output at op #" << op_index << " (";
  for (size_t i = 0; i < ops.size(); ++i) s << (i ? " > " : "") << ops[i];
  s << ")";
  if (!module.empty())
    s << (module.rfind("after ", 0) == 0 ? " after module " + module.substr(6) : " in module " + module);
  s << ": " << output << "; its inputs were finite:";
  for (const auto& in : inputs) s << " " << in << ";";
  return s.str();
}

NonFiniteLocator::NonFiniteLocator() : state_(std::make_shared<State>()) {
  State* none = nullptr;
  TORCH_CHECK(current.compare_exchange_strong(none, state_.get()),
              "ampp::NonFiniteLocator: another locator is active in this process; use one at a time");
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                           .needsInputs(true)
                                           .needsOutputs(true)
                                           .scopes({at::RecordScope::FUNCTION}));
}

NonFiniteLocator::~NonFiniteLocator() {
  at::removeCallback(handle_);
  current.store(nullptr);
}

NonFiniteLocator::NonFiniteLocator(const torch::nn::Module& model) : NonFiniteLocator() {
  for (const auto& p : model.named_parameters()) {
    const auto dot = p.key().rfind('.');
    state_->owners[p.value().unsafeGetTensorImpl()] = dot == std::string::npos ? p.key() : p.key().substr(0, dot);
  }
}

std::optional<NonFiniteOrigin> NonFiniteLocator::first() const {
  std::lock_guard<std::recursive_mutex> lock(state_->mutex);
  return state_->first;
}

int64_t NonFiniteLocator::ops_seen() const {
  std::lock_guard<std::recursive_mutex> lock(state_->mutex);
  return state_->seen;
}

}  // namespace ampp
