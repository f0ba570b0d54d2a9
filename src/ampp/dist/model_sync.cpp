// broadcast_coalesced: rank 0's parameter and buffer values to every rank, packed as bytes into flat
// chunks (DDP's start of training and broadcast_buffers, ZeRO's shards). That every rank holds the same model is
// checked before, by verify_same_model in reducer.cpp.
#include <ampp/dist/reducer.h>

#include <torch/torch.h>

namespace ampp::dist {
namespace {

// Gloo only moves float/double/half/int types; other dtypes travel as same-width words.
torch::Tensor transport_view(const torch::Tensor& flat) {
  switch (flat.scalar_type()) {
    case torch::kBFloat16:
    case torch::kShort:
      return flat.view(torch::kHalf);
    case torch::kBool:
      return flat.view(torch::kByte);
    default:
      return flat;
  }
}

// The end of the chunk that starts at tensors[i]: consecutive tensors on one device, of any dtypes, up to
// chunk_bytes (at least one tensor).
size_t chunk_end(const std::vector<torch::Tensor>& tensors, size_t i, int64_t chunk_bytes) {
  int64_t bytes = tensors[i].numel() * tensors[i].element_size();
  size_t j = i + 1;
  for (; j < tensors.size(); ++j) {
    const int64_t b = tensors[j].numel() * tensors[j].element_size();
    if (tensors[j].device() != tensors[i].device() || bytes + b > chunk_bytes) break;
    bytes += b;
  }
  return j;
}

// The chunk's bytes in one flat uint8 tensor: one collective for a model's mixed buffers (BatchNorm's
// float statistics and int64 counters) instead of one per run of a dtype, each a round trip that both
// ranks wait for (this was 4 broadcasts and 1.6-3.0 ms per step for the CNN's buffers).
torch::Tensor packed_bytes(const std::vector<torch::Tensor>& chunk) {
  std::vector<torch::Tensor> parts;
  for (const auto& t : chunk) parts.push_back(t.contiguous().view({-1}).view(torch::kByte));
  return torch::cat(parts);
}

void unpack_bytes(const torch::Tensor& flat, std::vector<torch::Tensor>& chunk) {
  int64_t offset = 0;
  for (auto& t : chunk) {
    const int64_t bytes = t.numel() * t.element_size();
    // clone(): viewing bytes as a wider dtype needs a start aligned to its element size.
    t.copy_(flat.narrow(0, offset, bytes).clone().view(t.scalar_type()).view(t.sizes()));
    offset += bytes;
  }
}

}  // namespace

void broadcast_coalesced(const ProcessGroup& group, const std::vector<torch::Tensor>& tensors, int64_t chunk_bytes,
                         int src) {
  torch::NoGradGuard no_grad;
  size_t i = 0;
  while (i < tensors.size()) {
    const size_t j = chunk_end(tensors, i, chunk_bytes);
    std::vector<torch::Tensor> chunk(tensors.begin() + static_cast<std::ptrdiff_t>(i),
                                     tensors.begin() + static_cast<std::ptrdiff_t>(j));
    // A lone contiguous tensor (a large parameter) travels as it is: no packing copy, no buffer.
    const bool in_place = chunk.size() == 1 && chunk[0].is_contiguous();
    auto flat = in_place ? transport_view(chunk[0].view({-1})) : packed_bytes(chunk);
    std::vector<torch::Tensor> io{flat};
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    group.c10d()->broadcast(io, opts)->wait();
    if (group.rank() != src && !in_place) unpack_bytes(flat, chunk);
    i = j;
  }
}

}  // namespace ampp::dist
