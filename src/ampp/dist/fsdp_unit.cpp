// FSDP units: the all-gather of a unit's shards into its module parameters, their release, and the
// reduce-scatter of its gradients into the shards (FSDP2's collectives, one per unit and dtype).
#include "fsdp_unit.h"

#include "torch_compat.h"

#include <c10/util/strides.h>

#include <algorithm>
#include <map>

namespace ampp::dist::detail {
namespace {

constexpr int64_t kAlignBytes = 16;  // every parameter's bytes start aligned, so they can be viewed as any dtype

int64_t aligned(int64_t bytes) { return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

// Each slot of the shared-memory segment (FullyShardOptions::shared_memory): the collectives move larger
// tensors in pieces, so the segment (2 x world slots) stays this size whatever the units' size.
constexpr int64_t kSegmentBytes = int64_t{4} << 20;

// Rank r's chunk of `p` inside `bytes` (a rank's all-gather chunk), as [rows_per_rank, row_numel].
torch::Tensor chunk_in(const torch::Tensor& bytes, const ShardedParam& p, int64_t offset) {
  const int64_t n = p.chunk_numel() * c10::elementSize(p.gathered);
  return bytes.narrow(0, offset, n).view(p.gathered).view({p.rows_per_rank, p.row_numel});
}

// Every rank's `mine` (bytes) into the rows of `all` [world, n].
void all_gather_bytes(const FsdpContext& context, const torch::Tensor& mine, torch::Tensor& all) {
  const auto& group = context.group;
  if (group.size() == 1) {
    all[0].copy_(mine);
  } else if (context.shared_memory) {
    sized_segment(*context.shared_memory, group, std::min(mine.numel(), kSegmentBytes), kSegmentBytes)
        .all_gather_(mine, all);
  } else {
    std::vector<std::vector<torch::Tensor>> out{all.unbind(0)};
    std::vector<torch::Tensor> in{mine};
    group.c10d()->allgather(out, in)->wait();
  }
}

// Sum over the ranks of `input` [world, n], rank r receiving row r (c10d's reduce_scatter; LibTorch 1.x's
// Gloo has none, so there it is an allreduce of the whole, in float32 for Gloo's sake).
torch::Tensor reduce_scatter_sum(const FsdpContext& context, const torch::Tensor& input) {
  const auto& group = context.group;
  if (group.size() == 1) return input[0];
  if (context.shared_memory) {
    auto out = torch::empty({input.size(1)}, input.options());
    sized_segment(*context.shared_memory, group, kSegmentBytes, kSegmentBytes).reduce_scatter_sum_(input, out);
    return out;
  }
#if AMPP_GLOO_HAS_REDUCE_SCATTER
  // Gloo's reduce_scatter takes CPU tensors only: CUDA gradients (workers sharing a GPU) go through the host.
  const bool via_host = !input.is_cpu() && group.backend() == "gloo";
  const torch::Tensor sent = via_host ? input.cpu() : input;
  std::vector<torch::Tensor> out{torch::empty({input.size(1)}, sent.options())};
  std::vector<std::vector<torch::Tensor>> in{sent.unbind(0)};
  group.c10d()->reduce_scatter(out, in)->wait();
  return via_host ? out[0].to(input.device()) : out[0];
#else
  std::vector<torch::Tensor> all{input.to(torch::kFloat)};
  group.c10d()->allreduce(all)->wait();
  return all[0][group.rank()].to(input.scalar_type());
#endif
}

// FSDP2's factors for averaging over `world` ranks: fp16 is divided by about sqrt(world) before the sum
// and by the rest after it, so neither the addends nor the sum leave its range; other dtypes after.
std::pair<double, double> divide_factors(c10::ScalarType dtype, int world) {
  if (dtype != torch::kHalf) return {1.0, static_cast<double>(world)};
  double pre = 1;
  while (static_cast<int64_t>(world) % static_cast<int64_t>(pre) == 0 && world / pre > pre) pre *= 2;
  return {pre, world / pre};
}

}  // namespace

void allocate_storage(const torch::Tensor& param) {
  auto storage = param.storage();
  const size_t bytes = static_cast<size_t>(param.numel()) * param.element_size();
  if (storage.nbytes() == bytes) return;
  storage.set_data_ptr_noswap(c10::GetAllocator(param.device().type())->allocate(bytes));
  storage.set_nbytes(bytes);
}

void free_storage(const torch::Tensor& param) {
  auto storage = param.storage();
  storage.set_data_ptr_noswap(c10::DataPtr(nullptr, param.device()));
  storage.set_nbytes(0);
}

torch::Tensor storage_alias(const torch::Tensor& param, at::IntArrayRef sizes) {
  auto alias = torch::empty({0}, param.options().requires_grad(false));
  torch::NoGradGuard no_grad;
  alias.set_(param.storage(), 0, sizes, c10::contiguous_strides(sizes));
  return alias;
}

FsdpUnit::FsdpUnit(std::vector<ShardedParam*> params, const FsdpContext* context)
    : params_(std::move(params)), context_(context) {
  for (auto* p : params_)
    if (p->shard.requires_grad()) trainable_.push_back(p);
  for (const auto* p : params_) {
    byte_offsets_.push_back(chunk_bytes_);
    chunk_bytes_ += aligned(p->chunk_numel() * c10::elementSize(p->gathered));
  }
  reset_pending();
}

FsdpUnit* UnitOrder::neighbour(const FsdpUnit* unit, int step) const {
  const auto it = std::find(recorded.begin(), recorded.end(), unit);
  if (it == recorded.end()) return nullptr;
  const auto at = (it - recorded.begin()) + step;
  return at >= 0 && at < static_cast<int64_t>(recorded.size()) ? recorded[at] : nullptr;
}

torch::Tensor FsdpUnit::packed_chunk() const {
  auto device = params_.empty() ? torch::kCPU : params_[0]->padded.device();
  auto mine = torch::empty({chunk_bytes_}, torch::dtype(torch::kByte).device(device));
  for (size_t i = 0; i < params_.size(); ++i)
    chunk_in(mine, *params_[i], byte_offsets_[i]).copy_(params_[i]->padded.view({params_[i]->rows_per_rank, -1}));
  return mine;
}

void FsdpUnit::unpack_gathered(const torch::Tensor& all) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = *params_[i];
    allocate_storage(p.param);
    auto full = storage_alias(p.param, {p.rows, p.row_numel});
    for (int r = 0; r < all.size(0); ++r) {
      const int64_t rows = p.rows_of_rank(r);
      if (rows > 0)
        full.narrow(0, r * p.rows_per_rank, rows).copy_(chunk_in(all[r], p, byte_offsets_[i]).narrow(0, 0, rows));
    }
  }
}

void FsdpUnit::prefetch() {
  const auto& group = context_->group;
  if (gathered_ || pending_gather_ || context_->shared_memory || group.size() == 1) return;
  torch::NoGradGuard no_grad;
  PendingGather g{packed_chunk(), {}, {}};
  g.all = torch::empty({group.size(), chunk_bytes_}, g.mine.options());
  std::vector<std::vector<torch::Tensor>> out{g.all.unbind(0)};
  std::vector<torch::Tensor> in{g.mine};
  g.work = group.c10d()->allgather(out, in);
  pending_gather_ = std::move(g);
  ++context_->order->prefetched;
}

void FsdpUnit::unshard() {
  if (gathered_) return;
  torch::NoGradGuard no_grad;
  if (pending_gather_) {
    pending_gather_->work->wait();
    unpack_gathered(pending_gather_->all);
    pending_gather_.reset();
  } else {
    auto mine = packed_chunk();
    auto all = torch::empty({context_->group.size(), chunk_bytes_}, mine.options());
    all_gather_bytes(*context_, mine, all);
    unpack_gathered(all);
  }
  gathered_ = true;
}

void FsdpUnit::reshard() {
  if (pending_gather_) {  // prefetched but not used: every rank issued it, so it completes before it goes
    pending_gather_->work->wait();
    pending_gather_.reset();
  }
  if (!gathered_) return;
  for (const auto* p : params_) free_storage(p->param);
  gathered_ = false;
}

void FsdpUnit::gradient_ready() {
  if (context_->on_backward) context_->on_backward();
  if (--pending_ == 0) reduce_gradients();
}

void FsdpUnit::reduce_gradients() {
  // One reduce-scatter per reduce dtype (FSDP2 has one dtype per unit; per-parameter dtypes can make two).
  const auto forced = context_->options.mp_policy().reduce_dtype();
  std::map<c10::ScalarType, std::vector<ShardedParam*>> by_dtype;
  for (auto* p : trainable_) by_dtype[forced.value_or(p->gathered)].push_back(p);
  for (const auto& [dtype, group] : by_dtype) reduce_group(group, dtype);
  for (auto* p : trainable_) p->param.mutable_grad() = torch::Tensor();
  reshard();
  reset_pending();
}

void FsdpUnit::reduce_group(const std::vector<ShardedParam*>& params, c10::ScalarType reduce_dtype) {
  torch::NoGradGuard no_grad;
  const auto& group = context_->group;
  const int world = group.size();
  int64_t numel = 0;
  for (const auto* p : params) numel += p->chunk_numel();
  auto input = torch::zeros({world, numel}, params[0]->padded.options().dtype(reduce_dtype));
  int64_t offset = 0;
  for (const auto* p : params) {
    const auto& grad = p->param.grad();
    if (grad.defined()) {
      auto full = grad.reshape({p->rows, p->row_numel});
      for (int r = 0; r < world; ++r) {
        const int64_t rows = p->rows_of_rank(r);
        if (rows > 0)
          input[r]
              .narrow(0, offset, p->chunk_numel())
              .view({p->rows_per_rank, p->row_numel})
              .narrow(0, 0, rows)
              .copy_(full.narrow(0, r * p->rows_per_rank, rows));
      }
    }
    offset += p->chunk_numel();
  }
  const auto [pre, post] = divide_factors(reduce_dtype, world);
  if (pre != 1) input.div_(pre);
  auto output = reduce_scatter_sum(*context_, input);
  if (post != 1) output.div_(post);
  offset = 0;
  for (auto* p : params) {
    auto grad =
        output.narrow(0, offset, p->chunk_numel()).view({p->rows_per_rank, p->row_numel}).narrow(0, 0, p->local_rows);
    grad = grad.to(torch::kFloat).reshape(p->shard.sizes());
    auto& shard_grad = p->shard.mutable_grad();
    if (shard_grad.defined())
      shard_grad.add_(grad);
    else
      shard_grad = grad.clone(at::MemoryFormat::Contiguous);
    offset += p->chunk_numel();
  }
}

}  // namespace ampp::dist::detail
