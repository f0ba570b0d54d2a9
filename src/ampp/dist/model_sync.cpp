// broadcast_coalesced: rank 0's parameter and buffer values to every rank, packed by dtype into flat
// chunks (DDP's start of training and broadcast_buffers). That every rank holds the same model is
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

}  // namespace

void broadcast_coalesced(const ProcessGroup& group, const std::vector<torch::Tensor>& tensors, int64_t chunk_bytes,
                         int src) {
  torch::NoGradGuard no_grad;
  size_t i = 0;
  while (i < tensors.size()) {
    // A chunk: consecutive tensors of one dtype/device, up to chunk_bytes (at least one tensor).
    std::vector<torch::Tensor> chunk{tensors[i]};
    int64_t bytes = tensors[i].numel() * tensors[i].element_size();
    size_t j = i + 1;
    for (; j < tensors.size(); ++j) {
      const auto& t = tensors[j];
      const int64_t b = t.numel() * t.element_size();
      if (t.scalar_type() != tensors[i].scalar_type() || t.device() != tensors[i].device() || bytes + b > chunk_bytes)
        break;
      chunk.push_back(t);
      bytes += b;
    }
    // A lone contiguous tensor (a large parameter) travels as it is: no packing copy, no buffer.
    const bool in_place = chunk.size() == 1 && chunk[0].is_contiguous();
    std::vector<torch::Tensor> flat_parts;
    for (const auto& t : chunk) flat_parts.push_back(t.reshape({-1}));
    auto flat = in_place ? flat_parts[0] : torch::cat(flat_parts);
    std::vector<torch::Tensor> io{transport_view(flat)};
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    group.c10d()->broadcast(io, opts)->wait();
    if (group.rank() != src && !in_place) {
      int64_t offset = 0;
      for (auto& t : chunk) {
        t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
    i = j;
  }
}

}  // namespace ampp::dist
