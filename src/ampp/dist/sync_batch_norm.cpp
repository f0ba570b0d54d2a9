#include <ampp/dist/sync_batch_norm.h>

#include <ostream>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>

namespace ampp::dist {
namespace {

// Statistics are computed in float32 for bf16/fp16 inputs (PyTorch's accumulate type), else in
// the input's own dtype.
c10::ScalarType accumulate_dtype(const torch::Tensor& t) {
  const auto dtype = t.scalar_type();
  return dtype == torch::kHalf || dtype == torch::kBFloat16 ? torch::kFloat : dtype;
}

// Per-channel shape for broadcasting against (N, C, ...).
torch::Tensor per_channel(const torch::Tensor& t, int64_t input_dim) {
  std::vector<int64_t> shape(static_cast<size_t>(input_dim), 1);
  shape[1] = -1;
  return t.reshape(shape);
}

struct GlobalStats {
  torch::Tensor mean;      // (C), accumulate dtype
  torch::Tensor var;       // (C), biased, accumulate dtype
  torch::Tensor unbiased;  // (C), for the running variance
  torch::Tensor count;     // 0-dim double: elements per channel over all ranks, on the input's device
};

// [mean (C), biased var (C), count] of this rank, sent in double (exact counts, a stable merge).
torch::Tensor local_stats(const torch::Tensor& x, int64_t channels) {
  const int64_t count = x.numel() / channels;
  if (count == 0) return torch::zeros({2 * channels + 1}, x.options().dtype(torch::kDouble));
  // LibTorch's BatchNorm statistics kernel: one fused pass (4x faster than var_mean over dims 0,2,3).
  auto [mean, var] = torch::batch_norm_update_stats(x.to(accumulate_dtype(x)), {}, {}, 0.0);
  return torch::cat({mean.to(torch::kDouble), var.to(torch::kDouble),
                     torch::full({1}, static_cast<double>(count), x.options().dtype(torch::kDouble))});
}

// Fewer than two values per channel over all ranks have no variance. The counts are on the input's device:
// on the CPU they are read here; on a GPU that read would wait for the allgather in every layer's forward,
// so there only this rank's own count is checked, from the shapes (PyTorch's rule).
void check_more_than_one_value(const torch::Tensor& counts, int64_t local_count, int world_size) {
  if (!counts.is_cpu()) {
    TORCH_CHECK(local_count > 1 || world_size > 1,
                "SyncBatchNorm: expected more than 1 value per channel when "
                "training, got ",
                local_count, "; use larger batches or eval()");
    return;
  }
  const double total = counts.sum().item<double>();
  if (total > 1) return;
  std::string per_rank;  // every rank sees the same counts, so every rank fails here together
  for (int64_t r = 0; r < counts.size(0); ++r) per_rank += (r ? ", " : "") + std::to_string(counts[r].item<int64_t>());
  TORCH_CHECK(false, "SyncBatchNorm: expected more than 1 value per channel over all ranks when training, got ", total,
              " (values per channel on each rank: ", per_rank, "); use larger batches or eval()");
}

// Chan et al.'s pairwise merge, all ranks at once: M2 = sum n_r var_r + sum n_r (mean_r - mean)^2. On the
// device: nothing is read on the host.
GlobalStats merge_stats(const torch::Tensor& gathered, int64_t channels, c10::ScalarType dtype) {
  const auto counts = gathered.select(1, 2 * channels);  // (W)
  const auto total = counts.sum();
  const auto means = gathered.narrow(1, 0, channels);        // (W, C)
  const auto vars = gathered.narrow(1, channels, channels);  // (W, C)
  const auto n = counts.unsqueeze(1);
  const auto mean = (n * means).sum(0) / total;
  const auto m2 = (n * vars).sum(0) + (n * (means - mean).square()).sum(0);
  return {mean.to(dtype), (m2 / total).to(dtype), (m2 / (total - 1)).to(dtype), total};
}

// The buffers updated in place (undefined when not tracked). Passed to the autograd function as a
// non-tensor argument: it only accepts defined tensors as differentiable inputs.
struct RunningStats {
  torch::Tensor mean, var;
  double momentum = 0.1;
};

void update_running_stats(const GlobalStats& stats, const RunningStats& running) {
  torch::NoGradGuard no_grad;
  if (running.mean.defined())
    running.mean.mul_(1 - running.momentum).add_(stats.mean.to(running.mean.scalar_type()), running.momentum);
  if (running.var.defined())
    running.var.mul_(1 - running.momentum).add_(stats.unbiased.to(running.var.scalar_type()), running.momentum);
}

// Holds the group in the autograd context until backward.
struct SavedGroup : torch::CustomClassHolder {
  explicit SavedGroup(ProcessGroup g) : group(std::move(g)) {}
  ProcessGroup group;
};

const ProcessGroup& saved_group(torch::autograd::AutogradContext* ctx) {
  const auto capsule = ctx->saved_data["group"].toCapsule();
  return dynamic_cast<const SavedGroup&>(*capsule).group;
}

class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias, const RunningStats& running,
                               double eps, const ProcessGroup& group) {
    // Explicit dtypes below; an enclosing autocast region must not re-cast the arithmetic.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto x = input.contiguous(input.suggest_memory_format());  // channels_last stays channels_last
    const int64_t channels = x.size(1);
    std::vector<std::vector<torch::Tensor>> gathered{std::vector<torch::Tensor>(static_cast<size_t>(group.size()))};
    std::vector<torch::Tensor> local{local_stats(x, channels)};
    for (auto& t : gathered[0]) t = torch::empty_like(local[0]);
    group.c10d()->allgather(gathered, local)->wait();
    const auto all = torch::stack(gathered[0]);
    check_more_than_one_value(all.select(1, 2 * channels), x.numel() / channels, group.size());
    const auto stats = merge_stats(all, channels, accumulate_dtype(x));
    update_running_stats(stats, running);

    const auto invstd = (stats.var + eps).rsqrt();
    ctx->save_for_backward({x, weight, stats.mean, invstd});
    ctx->saved_data["count"] = stats.count;
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<SavedGroup>(group));
    if (x.numel() == 0) return torch::empty_like(x);
    // LibTorch's inference kernel with the global statistics: one fused pass, y = x * alpha + beta
    // with alpha = invstd * weight and beta = bias - mean * alpha, as its own training forward does.
    const auto acc = invstd.scalar_type();
    return torch::batch_norm(x.to(acc), weight.to(acc), bias.to(acc), stats.mean, stats.var, /*training=*/false, 0.0,
                             eps, /*cudnn_enabled=*/false)
        .to(x.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    const auto acc = invstd.scalar_type();
    const int64_t channels = x.size(1), dim = x.dim();
    const auto xa = x.to(acc), dy = grad_outputs[0].contiguous(x.suggest_memory_format()).to(acc);
    auto sum_dy = torch::zeros({channels}, dy.options()), sum_dy_xmu = torch::zeros_like(sum_dy);
    if (x.numel() > 0) {
      // LibTorch's fused BatchNorm backward asked for its two reductions only: with invstd 1 its weight
      // gradient is sum(dy * (x - mean)) and its bias gradient sum(dy); one pass over dy and x. Every
      // tensor argument defined, though training mode reads neither the weight nor the running
      // statistics here: the CUDA kernel asks each for its device ("tensor does not have a device").
      const auto ones = torch::ones_like(mean);
      std::tie(std::ignore, sum_dy_xmu, sum_dy) = at::native_batch_norm_backward(
          dy, xa, ones, mean, ones, mean, ones, /*train=*/true, 0.0, {false, true, true});
    }
    torch::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    if (ctx->needs_input_grad(0)) {
      std::vector<torch::Tensor> combined{torch::cat({sum_dy, sum_dy_xmu})};
      saved_group(ctx).c10d()->allreduce(combined)->wait();
      const auto count = ctx->saved_data["count"].toTensor().to(acc);
      const auto mean_dy = combined[0].narrow(0, 0, channels) / count;
      const auto mean_dy_xmu = combined[0].narrow(0, channels, channels) / count;
      // (dy - mean_dy - (x - mean) * invstd^2 * mean_dy_xmu) * invstd * weight, in three passes;
      // x - mean is formed first (no cancellation when |mean| >> std).
      const auto a = invstd * weight.to(acc), k = invstd.square() * mean_dy_xmu;
      grad_input =
          torch::addcmul(per_channel(-mean_dy * a, dim), xa - per_channel(mean, dim), per_channel(-k * a, dim));
      grad_input = grad_input.addcmul_(dy, per_channel(a, dim)).to(x.scalar_type());
    }
    return {grad_input, grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

thread_local int t_local_guards = 0;

}  // namespace

LocalBatchNormGuard::LocalBatchNormGuard() { ++t_local_guards; }
LocalBatchNormGuard::~LocalBatchNormGuard() { --t_local_guards; }
bool LocalBatchNormGuard::active() { return t_local_guards > 0; }

torch::Tensor sync_batch_norm(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                              const torch::Tensor& running_mean, const torch::Tensor& running_var, double momentum,
                              double eps, const ProcessGroup& group) {
  TORCH_CHECK(group, "ampp::dist::sync_batch_norm needs a process group (init_process_group first)");
  TORCH_CHECK(input.dim() >= 2, "SyncBatchNorm: expected at least 2D input (got ", input.dim(), "D input)");
  TORCH_CHECK(input.size(1) > 0, "SyncBatchNorm: the number of input channels (dimension 1) must be non-zero");
  for (const auto* t : {&weight, &bias, &running_mean, &running_var}) {
    TORCH_CHECK(!t->defined() || (t->dim() == 1 && t->size(0) == input.size(1)), "SyncBatchNorm: input has ",
                input.size(1), " channels (dimension 1) but the module was built for ", t->numel(),
                "; make num_features match the layer before it");
  }
  // Without affine parameters: weight 1 and bias 0, which change no value (x * 1 and x + 0 are exact).
  const auto channel_options = input.options().dtype(accumulate_dtype(input));
  const auto w = weight.defined() ? weight : torch::ones({input.size(1)}, channel_options);
  const auto b = bias.defined() ? bias : torch::zeros({input.size(1)}, channel_options);
  return SyncBatchNormFunction::apply(input, w, b, RunningStats{running_mean, running_var, momentum}, eps, group);
}

void SyncBatchNormImpl::_check_input_dim(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "SyncBatchNorm: expected at least 2D input (got ", input.dim(), "D input)");
}

ProcessGroup SyncBatchNormImpl::sync_group() const {
  if (LocalBatchNormGuard::active()) return {};
  if (options.process_group()) return options.process_group();
  return is_initialized() ? default_group() : ProcessGroup();
}

// BatchNorm's own forward when there is nothing to synchronise (eval, one rank, no group, a
// LocalBatchNormGuard).
torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  _check_input_dim(input);
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked += 1;
    if (!options.momentum()) factor = 1.0 / num_batches_tracked.item<double>();  // cumulative average
  }
  const bool batch_stats = is_training() || !options.track_running_stats();
  const ProcessGroup group = is_training() ? sync_group() : ProcessGroup();
  if (!group || group.size() < 2) {
    return torch::nn::functional::detail::batch_norm(input, running_mean, running_var, weight, bias, batch_stats,
                                                     factor, options.eps());
  }
  return sync_batch_norm(input, weight, bias, running_mean, running_var, factor, options.eps(), group);
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "ampp::dist::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum())
    stream << *options.momentum();
  else
    stream << "None";
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats() << ")";
}

}  // namespace ampp::dist
