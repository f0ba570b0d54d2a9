#pragma once
// DistributedDataParallel for any torch::nn::Module holder (or std::shared_ptr<Module>):
//   ampp::dist::DistributedDataParallel ddp(net, pg);   // broadcasts rank 0's weights
//   auto loss = criterion(ddp->forward(x), y);
//   loss.backward();                                     // grads averaged across ranks on return
//   { auto guard = ddp.no_sync(); ... }                  // accumulate locally
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/pimpl.h>

#include <ampp/dist/comm_hooks.h>
#include <ampp/dist/process_group.h>
#include <ampp/dist/reducer.h>

namespace ampp::dist {

// PyTorch's kDefaultFirstBucketBytes (dist._DEFAULT_FIRST_BUCKET_BYTES).
inline constexpr int64_t kDefaultFirstBucketBytes = 1 << 20;

struct DistributedDataParallelOptions {
  // Re-broadcast rank 0's buffers (e.g. BatchNorm running stats) before each forward.
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Bucket size cap in MiB (PyTorch: 25).
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  // Cap of the first bucket to be reduced (holding the last-used parameters), so communication
  // starts early in backward (PyTorch: 1 MiB).
  TORCH_ARG(int64_t, first_bucket_bytes) = kDefaultFirstBucketBytes;
  // Traverse the autograd graph after each forward and treat parameters that did not take part as
  // ready (zero contribution). Without it an unused parameter is an error at the next forward.
  TORCH_ARG(bool, find_unused_parameters) = false;
  // Make each parameter's .grad a slot of its bucket (PyTorch's gradient_as_bucket_view): backward
  // accumulates straight into the buckets, so the copies into and out of them and one gradient-sized
  // buffer go away. Unlike PyTorch's bucket views, the slots are not autograd views, so
  // Optimizer::zero_grad() and Module::zero_grad() keep working on them.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
};

namespace detail {
// Output tensors of forward, so find_unused_parameters can walk the graph from them.
inline void collect_tensors(const torch::Tensor& t, std::vector<torch::Tensor>& out) { out.push_back(t); }
inline void collect_tensors(const std::vector<torch::Tensor>& v, std::vector<torch::Tensor>& out) {
  out.insert(out.end(), v.begin(), v.end());
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& p, std::vector<torch::Tensor>& out);
template <typename... T>
void collect_tensors(const std::tuple<T...>& t, std::vector<torch::Tensor>& out);
template <typename T>
void collect_tensors(const T&, std::vector<torch::Tensor>&) {}  // not a tensor container
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& p, std::vector<torch::Tensor>& out) {
  collect_tensors(p.first, out);
  collect_tensors(p.second, out);
}
template <typename... T>
void collect_tensors(const std::tuple<T...>& t, std::vector<torch::Tensor>& out) {
  std::apply([&out](const auto&... x) { (collect_tensors(x, out), ...); }, t);
}

template <typename T>
std::shared_ptr<torch::nn::Module> module_ptr(const torch::nn::ModuleHolder<T>& h) {
  return h.ptr();
}
template <typename T>
std::shared_ptr<torch::nn::Module> module_ptr(const std::shared_ptr<T>& p) {
  return p;
}

template <typename T>
struct is_shared_module : std::false_type {};
template <typename T>
struct is_shared_module<std::shared_ptr<T>> : std::is_base_of<torch::nn::Module, T> {};
}  // namespace detail

// RAII form of PyTorch's `with ddp.no_sync():`.
class [[nodiscard]] NoSyncGuard {
 public:
  explicit NoSyncGuard(Reducer& reducer) : reducer_(&reducer), previous_(reducer.require_backward_grad_sync()) {
    reducer.set_require_backward_grad_sync(false);
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept
      : reducer_(std::exchange(other.reducer_, nullptr)), previous_(other.previous_) {}
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  ~NoSyncGuard() {
    if (reducer_) reducer_->set_require_backward_grad_sync(previous_);
  }

 private:
  Reducer* reducer_;
  bool previous_;
};

template <typename ModuleHolder>
class DistributedDataParallel {
  static_assert(torch::detail::is_module_holder<ModuleHolder>::value || detail::is_shared_module<ModuleHolder>::value,
                "ampp::dist::DistributedDataParallel shares the module it wraps, so it takes a module holder "
                "(TORCH_MODULE(Net) over NetImpl, as LibTorch's own modules) or a std::shared_ptr<NetImpl>. A module "
                "held by value (`Net model;` with `struct Net : torch::nn::Module`) would be copied: declare it as "
                "`auto model = std::make_shared<Net>();` and pass `model`.");

 public:
  explicit DistributedDataParallel(ModuleHolder module, ProcessGroup group = default_group(),
                                   DistributedDataParallelOptions options = {})
      : module_(std::move(module)),
        reducer_(std::make_shared<Reducer>(detail::module_ptr(module_), std::move(group), options)) {}
  DistributedDataParallel(ModuleHolder module, DistributedDataParallelOptions options)
      : DistributedDataParallel(std::move(module), default_group(), options) {}

  // Calls the wrapped module's forward, with DDP's bookkeeping around it.
  template <typename... Args>
  auto forward(Args&&... args) {
    reducer_->pre_forward();
    auto out = module_->forward(std::forward<Args>(args)...);
    std::vector<torch::Tensor> tensors;
    detail::collect_tensors(out, tensors);
    reducer_->post_forward(tensors);
    return out;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  // ddp->forward(x) reads like the holder it wraps.
  DistributedDataParallel* operator->() { return this; }

  NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }
  // For ampp::dist::join (join.h): uneven numbers of batches per rank.
  Joinable& joinable() { return *reducer_; }
  void register_comm_hook(CommHook hook) { reducer_->register_comm_hook(std::move(hook)); }
  // ampp extension: how each forward's broadcast_buffers reaches the ranks (comm_hooks.h).
  void register_buffer_broadcast(BufferBroadcast broadcast) {
    reducer_->register_buffer_broadcast(std::move(broadcast));
  }
  void register_builtin_comm_hook(BuiltinCommHook type) {
    reducer_->register_comm_hook(builtin_comm_hook(type, reducer_->process_group()));
  }

  ModuleHolder& module() { return module_; }
  const ModuleHolder& module() const { return module_; }
  std::vector<torch::Tensor> parameters() const { return module_->parameters(); }
  Reducer& reducer() { return *reducer_; }
  const ProcessGroup& process_group() const { return reducer_->process_group(); }

 private:
  ModuleHolder module_;
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace ampp::dist
