// DDP's reducer. Per iteration:
//  forward:  pre_forward() checks that the previous backward reduced everything, rebuilds the
//            buckets once in the order the first backward's gradients became ready, re-broadcasts
//            buffers; post_forward() arms the hooks (and finds unused parameters if asked).
//  backward: a post hook on each parameter's AccumulateGrad node copies the fresh .grad into its
//            bucket slot (or finds it already there: gradient_as_bucket_view); when a bucket is
//            complete its allreduce starts at once (in bucket order), overlapping the rest of
//            backward. After the last bucket, a callback queued on the autograd engine waits for
//            all of them when the graph finishes and writes the averaged gradients back, so the
//            optimizer sees them as soon as backward() returns.
#include <ampp/dist/ddp.h>
#include <ampp/dist/reducer.h>

#include <ampp/dist/sync_batch_norm.h>

#include "control_tensors.h"
#include "log_format.h"
#include "torch_compat.h"

#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

namespace ampp::dist {
namespace {

using Clock = std::chrono::steady_clock;
using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;
constexpr int64_t kBroadcastChunkBytes = 250LL << 20;  // PyTorch's broadcast_bucket_size

// One round of join mode: who is active, who will reduce gradients, whose buffers count.
struct JoinRound {
  int active = 0;
  int syncing = 0;
  int authoritative = 0;  // the highest active rank
};

// A tensor over `length(sizes)` elements of `contents` from `offset`, made with set_() rather
// than narrow()/view(): an autograd view cannot serve as a .grad, because LibTorch's
// Optimizer::zero_grad() detaches grads in place, which throws on views.
torch::Tensor slot_alias(const torch::Tensor& contents, size_t offset, c10::IntArrayRef sizes) {
  torch::NoGradGuard no_grad;
  return torch::empty({0}, contents.options())
      .set_(contents.storage(), contents.storage_offset() + static_cast<int64_t>(offset), sizes,
            c10::contiguous_strides(sizes));
}

// True when `grad` already is this parameter's bucket slot (gradient_as_bucket_view).
bool is_slot(const torch::Tensor& grad, const torch::Tensor& slot) {
  return grad.is_alias_of(slot) && grad.data_ptr() == slot.data_ptr() && grad.sizes() == slot.sizes();
}

uint64_t shape_hash(const std::vector<torch::Tensor>& params) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over dtype and sizes
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
  for (const auto& p : params) {
    mix(static_cast<uint64_t>(p.scalar_type()));
    mix(static_cast<uint64_t>(p.dim()));
    for (auto s : p.sizes()) mix(static_cast<uint64_t>(s));
  }
  return h;
}

// All ranks must wrap the same model (PyTorch's _verify_param_shape_across_processes).
void verify_same_model(const ProcessGroup& group, const std::vector<torch::Tensor>& params) {
  auto mine =
      torch::tensor({static_cast<int64_t>(params.size()), static_cast<int64_t>(shape_hash(params))}, torch::kLong)
          .to(detail::control_device(group, params));
  std::vector<torch::Tensor> in{mine};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < group.size(); ++r) out[0].push_back(torch::empty_like(mine));
  group.c10d()->allgather(out, in)->wait();
  const auto all = torch::stack(out[0]).cpu();  // one copy to the host, then reads
  const auto ref = all[0];
  for (int r = 1; r < group.size(); ++r) {
    const auto other = all[r];
    TORCH_CHECK(other[0].item<int64_t>() == ref[0].item<int64_t>(),
                "DDP expects same model across all ranks, but Rank ", r, " has ", other[0].item<int64_t>(),
                " params, while rank 0 has inconsistent ", ref[0].item<int64_t>(),
                " params. Build the same model (same parameters requiring grad) on every rank.");
    TORCH_CHECK(other[1].item<int64_t>() == ref[1].item<int64_t>(),
                "DDP expects same model across all ranks, but the "
                "parameter shapes or dtypes of rank ",
                r,
                " do not match those of rank 0. Build the same model "
                "(same sizes, same dtype, e.g. cast before wrapping) on every rank.");
  }
}

}  // namespace

struct Reducer::Impl : std::enable_shared_from_this<Reducer::Impl> {
  // Nested, not in the anonymous namespace: a member's type must have linkage (-Wsubobject-linkage
  // when this file is compiled in a unity batch).
  struct Bucket {
    std::vector<size_t> vars;
    std::vector<size_t> offsets, lengths;
    torch::Tensor contents;
    std::vector<torch::Tensor> views;
    size_t pending = 0;
    FuturePtr future;
  };

  ProcessGroup group;
  DistributedDataParallelOptions options;
  std::shared_ptr<torch::nn::Module> module;
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  std::vector<torch::Tensor> buffers;
  std::vector<compat::NodePtr> accumulators;
  std::unordered_map<const torch::autograd::Node*, size_t> accumulator_index;
  std::vector<std::vector<size_t>> bucket_indices;
  std::vector<Bucket> buckets;
  std::vector<std::pair<size_t, size_t>> locator;  // param -> (bucket, slot)
  CommHook hook;
  BufferBroadcast buffer_broadcast;  // empty: broadcast_coalesced over the group
  bool require_backward_grad_sync = true;
  bool require_forward_param_sync = true;
  // Per iteration.
  bool expect_hooks = false;
  // A grad-enabled forward ran through DDP under no_sync(): its backward accumulates locally.
  bool local_backward_armed = false;
  bool require_finalize = false;
  bool first_hook_seen = false;
  size_t next_bucket = 0;
  std::vector<char> ready;
  std::vector<size_t> unused;  // locally unused (find_unused_parameters)
  bool has_rebuilt_buckets = false;
  std::vector<size_t> ready_order;  // until the rebuild: params in the order their grads became ready
  torch::Tensor local_used;         // int32 per param, allreduced to learn global use
  FuturePtr used_future;
  mutable std::mutex timeline_mu;
  IterationTimeline timeline, last_timeline;
  int64_t synced_backwards = 0;       // synchronised backwards done (or shadowed) on this rank
  const JoinOptions* join = nullptr;  // join mode (join.h) while set

  // Buckets fill in `order`, which should be the order gradients become ready in backward, so that
  // buckets complete (and start communicating) one after another while backward still runs.
  std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& order) const;
  void build_buckets(std::vector<std::vector<size_t>> indices);

  // PyTorch's rebuild_buckets: the first synchronised backward records the order gradients became
  // ready; before the next one, buckets are rebuilt in rank 0's order (ranks may see different
  // orders, and all must bucket alike). Once, and not with find_unused_parameters (as PyTorch).
  void rebuild_buckets_once(int source);
  // broadcast_buffers: rank `source`'s buffers to every rank, through buffer_broadcast if registered.
  void broadcast_buffers(int source) {
    if (buffer_broadcast)
      buffer_broadcast(buffers, source);
    else
      broadcast_coalesced(group, buffers, kBroadcastChunkBytes, source);
  }
  void install_hooks();
  void install_hook(size_t i, compat::NodePtr acc);

  // LibTorch's Module::load() (and any set_data()) gives a parameter a new gradient accumulator,
  // and the hooks stayed on the old one: the Python habit of wrapping first and loading a
  // checkpoint after would silently stop the reduction. Re-hook whatever accumulator is live.
  void refresh_hooks();
  std::string unreduced_report() const;
  void ensure_prior_reduction_finished();
  void prepare_for_backward(const std::vector<torch::Tensor>& outputs);
  void autograd_hook(size_t i);
  void refuse_unexpected_gradient(size_t i) const;
  void mark_variable_ready(size_t i);
  void mark_bucket_ready();
  void launch(size_t b);
  FuturePtr reduce_bucket(size_t b);
  std::vector<torch::Tensor> module_state() const;
  void finalize_backward();
  JoinRound join_round(bool active, bool syncing);
  void shadow_backward();
};

std::vector<std::vector<size_t>> Reducer::Impl::assign_buckets(const std::vector<size_t>& order) const {
  const auto cap = static_cast<int64_t>(options.bucket_cap_mb() * 1024.0 * 1024.0);
  return compute_bucket_assignment_by_size(params, {options.first_bucket_bytes(), cap}, order);
}

void Reducer::Impl::build_buckets(std::vector<std::vector<size_t>> indices) {
  bucket_indices = std::move(indices);
  buckets.clear();
  locator.assign(params.size(), {0, 0});
  for (size_t b = 0; b < bucket_indices.size(); ++b) {
    Bucket bucket;
    bucket.vars = bucket_indices[b];
    size_t total = 0;
    for (size_t v : bucket.vars) {
      bucket.offsets.push_back(total);
      bucket.lengths.push_back(static_cast<size_t>(params[v].numel()));
      total += static_cast<size_t>(params[v].numel());
    }
    const auto& first = params[bucket.vars.front()];
    bucket.contents = torch::empty({static_cast<int64_t>(total)}, first.options().requires_grad(false));
    for (size_t k = 0; k < bucket.vars.size(); ++k) {
      bucket.views.push_back(slot_alias(bucket.contents, bucket.offsets[k], params[bucket.vars[k]].sizes()));
      locator[bucket.vars[k]] = {b, k};
    }
    buckets.push_back(std::move(bucket));
  }
}

void Reducer::Impl::rebuild_buckets_once(int source) {
  // After the first synchronised backward, on every rank alike (joined ranks count shadowed ones).
  if (has_rebuilt_buckets || options.find_unused_parameters() || synced_backwards < 1) return;
  has_rebuilt_buckets = true;
  // The source's order of gradients; a joined source that never ran a backward sends the current one.
  std::vector<int64_t> mine(ready_order.begin(), ready_order.end());
  if (mine.size() != params.size()) {
    mine.clear();
    for (const auto& bucket : bucket_indices) mine.insert(mine.end(), bucket.begin(), bucket.end());
  }
  std::vector<torch::Tensor> broadcast{torch::tensor(mine, torch::kLong).to(detail::control_device(group, params))};
  group.c10d()->broadcast(broadcast, c10d::BroadcastOptions{source, 0})->wait();
  const auto order_tensor = broadcast[0].cpu();
  const auto* rank0 = order_tensor.data_ptr<int64_t>();
  const std::vector<size_t> order(rank0, rank0 + order_tensor.numel());
  ready_order = {};
  auto indices = assign_buckets(order);
  if (indices == bucket_indices) return;
  // With gradient_as_bucket_view the grads still are slots of the old buckets (which they keep
  // alive); the next backward copies each into its new slot and re-points it, as after set-to-none.
  build_buckets(std::move(indices));
  log_info("DistributedDataParallel: buckets rebuilt in the order gradients became ready: {}",
           fmt::join(bucket_indices, " "));
}

void Reducer::Impl::install_hooks() {
  accumulators.assign(params.size(), nullptr);
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    TORCH_CHECK(acc, "ampp::dist::DistributedDataParallel: parameter ", names[i],
                " has no gradient accumulator (is it a leaf that requires grad?).");
    install_hook(i, std::move(acc));
  }
}

void Reducer::Impl::install_hook(size_t i, compat::NodePtr acc) {
  std::weak_ptr<Impl> weak = shared_from_this();
  acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [weak, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
        if (auto self = weak.lock()) self->autograd_hook(i);
        return outputs;
      }));
  if (accumulators[i]) accumulator_index.erase(accumulators[i].get());
  accumulator_index[acc.get()] = i;
  accumulators[i] = std::move(acc);
}

void Reducer::Impl::refresh_hooks() {
  for (size_t i = 0; i < params.size(); ++i) {
    if (torch::autograd::impl::try_get_grad_accumulator(params[i]) == accumulators[i]) continue;
    const auto [b, slot] = locator[i];
    TORCH_CHECK(params[i].numel() == static_cast<int64_t>(buckets[b].lengths[slot]) &&
                    params[i].scalar_type() == buckets[b].contents.scalar_type(),
                "ampp::dist::DistributedDataParallel: parameter ", names[i], " changed its shape or dtype (now ",
                params[i].sizes(), " ", params[i].scalar_type(),
                ") after DDP was built. Cast or load the model "
                "into its final shape and dtype before wrapping it.");
    install_hook(i, torch::autograd::impl::grad_accumulator(params[i]));
  }
}

std::string Reducer::Impl::unreduced_report() const {
  std::vector<size_t> idx;
  std::vector<std::string> nm;
  for (size_t i = 0; i < params.size(); ++i)
    if (!ready.empty() && !ready[i]) {
      idx.push_back(i);
      nm.push_back(names[i]);
    }
  return fmt::format(
      "\nParameter indices which did not receive grad for rank {}: {}\nParameters which did not "
      "receive grad for rank {}: {}",
      group.rank(), fmt::join(idx, " "), group.rank(), fmt::join(nm, ", "));
}

void Reducer::Impl::ensure_prior_reduction_finished() {
  if (!require_finalize) return;
  // No gradient at all since the last forward: its backward never ran, so the likeliest cause is two
  // forwards before one backward (a GAN's D(real) and D(fake)), not unused parameters.
  TORCH_CHECK(first_hook_seen,
              "DistributedDataParallel: this forward follows another whose backward has not run (no gradient "
              "has arrived since it). DDP reduces once per forward: run each forward's backward before the next "
              "forward (a GAN's D(real) and D(fake): one forward on both batches concatenated, or a backward "
              "after each), or run forwards that need no backward under torch::NoGradGuard. (PyTorch: \"Expected "
              "to have finished reduction in the prior iteration before starting a new one\".)",
              unreduced_report());
  if (options.find_unused_parameters()) {
    TORCH_CHECK(false,
                "Expected to have finished reduction in the prior iteration before starting a new one. "
                "Since `find_unused_parameters=True` is enabled, this likely means that not all `forward` outputs "
                "participate in computing loss. You can fix this by making sure all `forward` function outputs "
                "participate in calculating loss (and that backward() ran after each grad-enabled forward).",
                unreduced_report());
  }
  TORCH_CHECK(false,
              "Expected to have finished reduction in the prior iteration before starting a new one. This "
              "error indicates that your module has parameters that were not used in producing loss. You can "
              "enable unused parameter detection by passing DistributedDataParallelOptions()"
              ".find_unused_parameters(true) to ampp::dist::DistributedDataParallel, and by making sure all "
              "`forward` function outputs participate in calculating loss (and that backward() ran after each "
              "grad-enabled forward; evaluate under torch::NoGradGuard).",
              unreduced_report());
}

void Reducer::Impl::prepare_for_backward(const std::vector<torch::Tensor>& outputs) {
  expect_hooks = true;
  local_backward_armed = false;
  require_finalize = true;
  first_hook_seen = false;
  next_bucket = 0;
  ready.assign(params.size(), 0);
  if (!has_rebuilt_buckets) ready_order.clear();
  for (auto& b : buckets) {
    b.pending = b.vars.size();
    b.future.reset();
  }
  {
    std::lock_guard<std::mutex> lock(timeline_mu);
    timeline = IterationTimeline{};
    for (size_t b = 0; b < buckets.size(); ++b) {
      BucketTimeline t;
      t.index = b;
      t.num_params = buckets[b].vars.size();
      t.bytes = buckets[b].contents.numel() * buckets[b].contents.element_size();
      timeline.buckets.push_back(t);
    }
  }
  unused.clear();
  if (!options.find_unused_parameters()) return;
  local_used = torch::zeros({static_cast<int64_t>(params.size())},
                            torch::TensorOptions(torch::kInt).device(detail::control_device(group, params)));
  if (outputs.empty()) {
    log_warning(
        "DistributedDataParallel: forward returned no tensors DDP can see, so unused-parameter "
        "detection is skipped this iteration (every parameter is expected to get a gradient).");
    return;
  }
  // Walk the autograd graph from the outputs; parameters whose accumulator is not reached are unused.
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& o : outputs) {
    if (!o.defined() || !o.requires_grad()) continue;
    compat::NodePtr fn = o.grad_fn();
    if (!fn) fn = torch::autograd::impl::try_get_grad_accumulator(o);
    if (fn && seen.insert(fn.get()).second) stack.push_back(fn.get());
  }
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges())
      if (edge.function && seen.insert(edge.function.get()).second) stack.push_back(edge.function.get());
  }
  for (size_t i = 0; i < params.size(); ++i)
    if (!seen.count(accumulators[i].get())) unused.push_back(i);
}

void Reducer::Impl::autograd_hook(size_t i) {
  if (!expect_hooks) {  // no_sync(): plain local accumulation
    if (!local_backward_armed && require_backward_grad_sync) refuse_unexpected_gradient(i);
    return;
  }
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(timeline_mu);
    if (!first_hook_seen) timeline.first_hook = now;
    timeline.last_hook = now;
  }
  if (options.find_unused_parameters()) local_used[static_cast<int64_t>(i)] = 1;
  if (!has_rebuilt_buckets) ready_order.push_back(i);
  if (!first_hook_seen) {
    first_hook_seen = true;
    for (size_t u : unused) mark_variable_ready(u);  // contribute zeros for locally unused params
  }
  mark_variable_ready(i);
}

// A gradient that no DDP forward announced would be stepped unreduced, and the ranks' weights drift apart
// in silence (PyTorch's DDP ignores it). Under no_sync() local accumulation is what was asked for.
void Reducer::Impl::refuse_unexpected_gradient(size_t i) const {
  TORCH_CHECK(false, "DistributedDataParallel: parameter ", names[i],
              " got a gradient that DDP will not reduce: the forward that produced it called the wrapped module "
              "directly instead of the DDP wrapper (or a second backward ran over a forward DDP already reduced). "
              "Call the DDP wrapper for every forward whose backward trains; to accumulate gradients locally on "
              "purpose, run that forward and its backward under ddp.no_sync().");
}

void Reducer::Impl::mark_variable_ready(size_t i) {
  if (ready[i]) {
    TORCH_CHECK(false,
                "Expected to mark a variable ready only once. This error is caused by one of the following "
                "reasons: 1) Use of a module parameter outside the `forward` function, or in several concurrent "
                "forward-backward passes. 2) Reused parameters in multiple reentrant backward passes (or backward "
                "run twice on one forward).",
                options.find_unused_parameters()
                    ? " 3) Incorrect unused parameter detection: the parameter was not reachable from forward's "
                      "outputs but still received a gradient."
                    : "",
                " Parameter at index ", i, " with name ", names[i],
                " has been marked as ready twice. This means "
                "that multiple autograd engine hooks have fired for this particular parameter during this iteration.");
  }
  ready[i] = 1;
  const auto [b, slot] = locator[i];
  Bucket& bucket = buckets[b];
  auto& view = bucket.views[slot];
  auto& grad = params[i].mutable_grad();
  torch::NoGradGuard no_grad;
  if (grad.defined()) {
    TORCH_CHECK(grad.scalar_type() == view.scalar_type() && grad.device() == view.device(), "Expected ",
                view.toString(), " gradient for parameter ", names[i], ", got ", grad.toString(),
                ". DDP buckets keep each parameter's dtype/device; keep .grad in the parameter's dtype.");
    // Default path: pre-divide by the world size, then allreduce SUM (as PyTorch).
    auto inverse_world = [&] { return torch::scalar_tensor(1.0 / group.size(), grad.options()); };
    if (is_slot(grad, view)) {
      // gradient_as_bucket_view: backward accumulated straight into the bucket.
      if (!hook) view.mul_(inverse_world());
    } else {
      if (hook) {
        view.copy_(grad);
      } else {
        torch::mul_out(view, grad, inverse_world());
      }
      // First backward, or the grad was set to none since: from now on the grad is the slot.
      if (options.gradient_as_bucket_view()) grad = view;
    }
  } else {
    view.zero_();
  }
  if (--bucket.pending == 0) mark_bucket_ready();
}

void Reducer::Impl::mark_bucket_ready() {
  // Launch strictly in bucket order: every rank must issue the collectives in the same order.
  while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) launch(next_bucket++);
  if (next_bucket < buckets.size()) return;
  if (options.find_unused_parameters()) used_future = allreduce_sum_async(group, local_used);
  std::weak_ptr<Impl> weak = shared_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak] {
    if (auto self = weak.lock()) self->finalize_backward();
  });
}

void Reducer::Impl::launch(size_t b) {
  Bucket& bucket = buckets[b];
  {
    std::lock_guard<std::mutex> lock(timeline_mu);
    timeline.buckets[b].launched = Clock::now();
  }
  bucket.future = reduce_bucket(b);
  TORCH_CHECK(bucket.future, "ampp::dist: the comm hook returned a null future for bucket ", b, ".");
  std::weak_ptr<Impl> weak = shared_from_this();
  bucket.future->addCallback([weak, b](c10::ivalue::Future&) {
    if (auto self = weak.lock()) {
      std::lock_guard<std::mutex> lock(self->timeline_mu);
      if (b < self->timeline.buckets.size()) self->timeline.buckets[b].completed = Clock::now();
    }
  });
}

// The bucket's reduction: the comm hook's, or the default allreduce of the pre-divided sum.
FuturePtr Reducer::Impl::reduce_bucket(size_t b) {
  Bucket& bucket = buckets[b];
  std::vector<torch::Tensor> bucket_params;
  for (size_t v : bucket.vars) bucket_params.push_back(params[v]);
  GradBucket grad_bucket(b, buckets.size(), bucket.contents, bucket.offsets, bucket.lengths, bucket_params);
  return hook ? hook(grad_bucket) : allreduce_sum_async(group, bucket.contents);
}

// Every parameter (also those without grad) and buffer: what ranks must agree on.
std::vector<torch::Tensor> Reducer::Impl::module_state() const {
  std::vector<torch::Tensor> state;
  for (const auto& item : module->named_parameters(true)) state.push_back(item.value());
  state.insert(state.end(), buffers.begin(), buffers.end());
  return state;
}

void Reducer::Impl::finalize_backward() {
  torch::NoGradGuard no_grad;
  {
    std::lock_guard<std::mutex> lock(timeline_mu);
    timeline.finalize_begin = Clock::now();
  }
  // Whatever happens below, this iteration is over (an error propagates out of backward()).
  expect_hooks = false;
  require_finalize = false;
  ++synced_backwards;
  torch::Tensor global_used;
  if (options.find_unused_parameters()) {
    used_future->waitAndThrow();
    global_used = local_used.cpu();  // read below per parameter: one copy to the host
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.future->waitAndThrow();
    const auto result = bucket.future->value().toTensor();
    TORCH_CHECK(result.numel() == bucket.contents.numel(), "ampp::dist: the comm hook for bucket ", b,
                " returned a tensor of ", result.numel(), " elements; it must return the bucket's ",
                bucket.contents.numel(), " (same size as bucket.buffer()).");
    // gradient_as_bucket_view: the grads are the bucket, so only a hook's separate result is copied.
    if (options.gradient_as_bucket_view() && !result.is_same(bucket.contents)) bucket.contents.copy_(result);
    for (size_t k = 0; k < bucket.vars.size(); ++k) {
      const size_t v = bucket.vars[k];
      // A parameter no rank used keeps its .grad untouched (not zeroed, not created). With
      // gradient_as_bucket_view a grad that already is its slot was reduced in place (as PyTorch).
      if (global_used.defined() && global_used[static_cast<int64_t>(v)].item<int>() == 0) continue;
      auto& grad = params[v].mutable_grad();
      if (options.gradient_as_bucket_view()) {
        // Locally unused here but used elsewhere: no grad yet, it becomes the reduced slot.
        if (!grad.defined()) grad = bucket.views[k];
        TORCH_CHECK(is_slot(grad, bucket.views[k]), "ampp::dist::DistributedDataParallel: the gradient of ", names[v],
                    " was replaced during backward, so it is no longer its DDP bucket slot "
                    "(gradient_as_bucket_view). Do not assign .grad between forward and the end of backward.");
        continue;
      }
      auto reduced = result.narrow(0, static_cast<int64_t>(bucket.offsets[k]), static_cast<int64_t>(bucket.lengths[k]))
                         .view(params[v].sizes());
      if (grad.defined())
        grad.copy_(reduced);
      else
        grad = reduced.to(params[v].scalar_type()).clone();
    }
  }
  std::lock_guard<std::mutex> lock(timeline_mu);
  timeline.finalize_end = Clock::now();
  last_timeline = timeline;
}

Reducer::Reducer(std::shared_ptr<torch::nn::Module> module, ProcessGroup group, DistributedDataParallelOptions options)
    : impl_(std::make_shared<Impl>()) {
  TORCH_CHECK(module, "ampp::dist::DistributedDataParallel: the module is null.");
  TORCH_CHECK(group, "ampp::dist::DistributedDataParallel: the process group is empty; call init_process_group().");
  TORCH_CHECK(options.bucket_cap_mb() > 0, "ampp::dist::DistributedDataParallel: bucket_cap_mb must be > 0 (got ",
              options.bucket_cap_mb(), "); the default is 25.");
  TORCH_CHECK(options.first_bucket_bytes() > 0, "ampp::dist::DistributedDataParallel: first_bucket_bytes must be > 0.");
  auto& s = *impl_;
  s.group = std::move(group);
  s.options = options;
  s.module = std::move(module);
  // Registration order, shared parameters once (first occurrence), only those requiring grad.
  std::unordered_set<const void*> seen;
  for (const auto& item : s.module->named_parameters(/*recurse=*/true)) {
    const auto& p = item.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    TORCH_CHECK(!p.is_sparse(), "ampp::dist::DistributedDataParallel does not support sparse parameters (", item.key(),
                ").");
    s.params.push_back(p);
    s.names.push_back(item.key());
  }
  TORCH_CHECK(!s.params.empty(),
              "DistributedDataParallel is not needed when a module doesn't have any parameter that "
              "requires a gradient.");
  const auto device_type = s.params.front().device().type();
  for (size_t i = 0; i < s.params.size(); ++i)
    TORCH_CHECK(s.params[i].device().type() == device_type,
                "DistributedDataParallel's input module must be on the "
                "same type of devices, but parameter ",
                s.names[i], " is on ", s.params[i].device(), " and ", s.names[0], " on ", s.params[0].device(),
                ". Move the whole module with ->to(device) first.");
  for (const auto& b : s.module->buffers(/*recurse=*/true)) s.buffers.push_back(b);

  verify_same_model(s.group, s.params);
  // Every rank starts from rank 0's parameters and buffers.
  broadcast_coalesced(s.group, s.module_state(), kBroadcastChunkBytes, 0);

  // Until the first backward shows the real order: reverse registration order, the order in which
  // a feed-forward model's gradients become ready.
  std::vector<size_t> reverse_registration(s.params.size());
  for (size_t i = 0; i < reverse_registration.size(); ++i)
    reverse_registration[i] = reverse_registration.size() - 1 - i;
  s.build_buckets(s.assign_buckets(reverse_registration));
  s.install_hooks();
  log_info("DistributedDataParallel: {} parameters in {} buckets (cap {} MiB, first {} bytes), world size {}",
           s.params.size(), s.buckets.size(), options.bucket_cap_mb(), options.first_bucket_bytes(), s.group.size());
}

Reducer::~Reducer() = default;

void Reducer::pre_forward() {
  auto& s = *impl_;
  s.refresh_hooks();
  const bool sync = torch::GradMode::is_enabled() && s.require_backward_grad_sync;
  int source = 0;  // of the buffers and of the bucket order
  if (s.join) {
    const JoinRound round = s.join_round(/*active=*/true, sync);
    TORCH_CHECK(!s.join->throw_on_early_termination() || round.active == s.group.size(),
                "ampp::dist::join: detected at least one rank that exhausted its inputs "
                "(JoinOptions::throw_on_early_termination); throwing on every rank");
    source = round.authoritative;
  }
  if (sync) {
    s.ensure_prior_reduction_finished();
    s.rebuild_buckets_once(source);
  }
  if (s.options.broadcast_buffers() && s.require_forward_param_sync && !s.buffers.empty()) s.broadcast_buffers(source);
}

void Reducer::post_forward(const std::vector<torch::Tensor>& outputs) {
  auto& s = *impl_;
  if (torch::GradMode::is_enabled() && s.require_backward_grad_sync) {
    s.require_forward_param_sync = true;
    s.prepare_for_backward(outputs);
  } else {
    // no_sync() or no-grad forward: buffers are not re-broadcast before the next forward (as PyTorch).
    s.require_forward_param_sync = false;
    // Under no_sync() the backward accumulates locally. A no-grad forward has no backward, and leaves a
    // pending one (of an earlier forward) armed, as PyTorch.
    if (torch::GradMode::is_enabled()) {
      s.expect_hooks = false;
      s.local_backward_armed = true;
    }
  }
}

// ---- join mode (join.h) ----

JoinRound Reducer::Impl::join_round(bool active, bool syncing) {
  const int world = group.size(), rank = group.rank();
  auto mine = torch::zeros({2 * world}, torch::kInt);  // [active ranks | syncing ranks]
  if (active) mine[rank] = 1;
  if (syncing) mine[world + rank] = 1;
  std::vector<torch::Tensor> flags{mine.to(detail::control_device(group, params))};
  group.c10d()->allreduce(flags)->wait();
  const auto all = flags[0].cpu();
  const auto* f = all.data_ptr<int>();
  JoinRound round;
  for (int r = 0; r < world; ++r) {
    round.active += f[r];
    round.syncing += f[world + r];
    if (f[r]) round.authoritative = r;
  }
  return round;
}

// The active ranks' backward as a joined rank sees it: every bucket reduced (through the comm hook, if
// any) with zero gradients, in bucket order, then the unused-parameter allreduce.
void Reducer::Impl::shadow_backward() {
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.contents.zero_();  // this rank's own gradients are stale anyway: finish_join replaces the model
    bucket.future = reduce_bucket(b);
  }
  for (auto& bucket : buckets) bucket.future->waitAndThrow();
  if (options.find_unused_parameters())
    allreduce_sum_async(group, torch::zeros({static_cast<int64_t>(params.size())}, torch::kInt))->waitAndThrow();
  ++synced_backwards;
}

void Reducer::set_join_mode(const JoinOptions* options) {
  if (options != nullptr) {
    for (const auto& m : impl_->module->modules()) {
      const auto* bn = dynamic_cast<const SyncBatchNormImpl*>(m.get());
      TORCH_CHECK(!bn || !bn->sync_group() || bn->sync_group().size() < 2,
                  "ampp::dist::join cannot shadow SyncBatchNorm's collectives (they depend on the data of the "
                  "forward a joined rank does not run); give every rank the same number of batches instead "
                  "(DistributedSampler pads them equal; drop the last partial batch)");
    }
  }
  impl_->join = options;
}

int Reducer::shadow_iteration() {
  auto& s = *impl_;
  TORCH_CHECK(s.join, "Reducer::shadow_iteration outside ampp::dist::join");
  const JoinRound round = s.join_round(/*active=*/false, /*syncing=*/false);
  TORCH_CHECK(!s.join->throw_on_early_termination(), "ampp::dist::join: rank ", s.group.rank(),
              " exhausted its inputs (JoinOptions::throw_on_early_termination); every rank throws");
  if (round.active == 0) return 0;
  const bool sync = round.syncing > 0;
  if (sync) s.rebuild_buckets_once(round.authoritative);
  if (s.options.broadcast_buffers() && s.require_forward_param_sync && !s.buffers.empty())
    s.broadcast_buffers(round.authoritative);
  s.require_forward_param_sync = sync;  // what the active ranks' post_forward decides
  if (sync) s.shadow_backward();
  return round.active;
}

void Reducer::finish_join(bool active_to_the_end) {
  auto& s = *impl_;
  std::vector<torch::Tensor> source{torch::full({1}, active_to_the_end ? s.group.rank() : -1, torch::kInt)
                                        .to(detail::control_device(s.group, s.params))};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  s.group.c10d()->allreduce(source, max)->wait();
  torch::NoGradGuard no_grad;
  broadcast_coalesced(s.group, s.module_state(), kBroadcastChunkBytes, source[0].item<int>());
}

void Reducer::set_require_backward_grad_sync(bool on) { impl_->require_backward_grad_sync = on; }
bool Reducer::require_backward_grad_sync() const { return impl_->require_backward_grad_sync; }

void Reducer::register_buffer_broadcast(BufferBroadcast broadcast) {
  TORCH_CHECK(!impl_->buffer_broadcast, "register_buffer_broadcast can only be called once.");
  TORCH_CHECK(broadcast, "ampp::dist: register_buffer_broadcast got an empty function.");
  impl_->buffer_broadcast = std::move(broadcast);
}

void Reducer::register_comm_hook(CommHook hook) {
  TORCH_CHECK(!impl_->hook, "register_comm_hook or register_builtin_comm_hook can only be called once.");
  TORCH_CHECK(hook, "ampp::dist: register_comm_hook got an empty hook.");
  impl_->hook = std::move(hook);
}

const std::vector<std::vector<size_t>>& Reducer::bucket_indices() const { return impl_->bucket_indices; }
const std::vector<torch::Tensor>& Reducer::parameters() const { return impl_->params; }
const std::vector<std::string>& Reducer::parameter_names() const { return impl_->names; }
const ProcessGroup& Reducer::process_group() const { return impl_->group; }
IterationTimeline Reducer::last_timeline() const {
  std::lock_guard<std::mutex> lock(impl_->timeline_mu);
  return impl_->last_timeline;
}

}  // namespace ampp::dist
