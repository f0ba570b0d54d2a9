// Gradient bucket assignment (semantics of c10d's compute_bucket_assignment_by_size).
#include <ampp/dist/reducer.h>

#include <map>
#include <tuple>

namespace ampp::dist {

std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(const std::vector<torch::Tensor>& tensors,
                                                                   const std::vector<int64_t>& size_limits,
                                                                   const std::vector<size_t>& order) {
  TORCH_CHECK(!size_limits.empty(), "compute_bucket_assignment_by_size: size_limits must not be empty.");
  struct Open {
    std::vector<size_t> indices;
    int64_t bytes = 0;
    size_t limit_index = 0;
  };
  // One open bucket per (dtype, device): a bucket never mixes them.
  using Key = std::tuple<int, int, int>;
  std::map<Key, Open> open;
  std::vector<Key> key_order;  // close leftovers in first-seen order (deterministic)
  std::vector<std::vector<size_t>> result;
  for (const size_t i : order) {
    TORCH_CHECK(i < tensors.size(), "compute_bucket_assignment_by_size: index ", i, " out of range.");
    const auto& t = tensors[i];
    TORCH_CHECK(!t.is_sparse(), "No support for sparse tensors.");
    const Key key{static_cast<int>(t.scalar_type()), static_cast<int>(t.device().type()), t.device().index()};
    auto [it, inserted] = open.try_emplace(key);
    if (inserted) key_order.push_back(key);
    Open& b = it->second;
    b.indices.push_back(i);
    b.bytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
    const int64_t limit = size_limits[std::min(b.limit_index, size_limits.size() - 1)];
    if (b.bytes >= limit) {  // reaching the limit closes the bucket
      result.push_back(std::move(b.indices));
      b.indices.clear();
      b.bytes = 0;
      ++b.limit_index;
    }
  }
  for (const auto& key : key_order)
    if (!open[key].indices.empty()) result.push_back(std::move(open[key].indices));
  return result;
}

}  // namespace ampp::dist
