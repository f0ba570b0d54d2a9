// new_group: a subgroup of a process group, its backend built like the parent's over the parent's store
// under a key prefix of its own.
#include <ampp/dist/process_group.h>

#include <algorithm>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace ampp::dist {
namespace {

void check_subgroup_ranks(const ProcessGroup& parent, const std::vector<int>& sorted) {
  TORCH_CHECK(!sorted.empty(), "ampp::dist::new_group: the list of ranks is empty; name at least one rank of the ",
              parent.size(), " in the parent group.");
  TORCH_CHECK(sorted.front() >= 0 && sorted.back() < parent.size(), "ampp::dist::new_group: rank ",
              sorted.front() < 0 ? sorted.front() : sorted.back(), " is not in the parent group, whose ranks are 0..",
              parent.size() - 1, ".");
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  TORCH_CHECK(twice == sorted.end(), "ampp::dist::new_group: rank ", twice == sorted.end() ? 0 : *twice,
              " is listed twice; list each rank once.");
}

}  // namespace

ProcessGroup new_group(const ProcessGroup& parent, std::vector<int> ranks, const std::string& backend) {
  TORCH_CHECK(parent, "ampp::dist::new_group needs an initialised parent group (init_process_group).");
  const auto& p = parent.state();
  TORCH_CHECK(p.make_backend && p.store,
              "ampp::dist::new_group: the parent group was wrapped around an existing "
              "c10d group (wrap_process_group), so ampp cannot build a backend like it; create the parent with "
              "init_process_group, or build the subgroup's c10d group yourself and wrap it.");
  std::sort(ranks.begin(), ranks.end());
  check_subgroup_ranks(parent, ranks);
  // Counted on every rank of the parent, members or not, so that all agree on the name.
  const int number = p.subgroups_made.fetch_add(1);
  const auto me = std::find(ranks.begin(), ranks.end(), parent.rank());
  if (me == ranks.end()) return {};

  auto state = std::make_shared<ProcessGroup::State>();
  state->store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("ampp/subgroup/{}", number), p.store);
  state->rank = static_cast<int>(me - ranks.begin());
  state->size = static_cast<int>(ranks.size());
  state->local_rank = state->rank;
  state->local_size = state->size;
  state->backend = backend.empty() ? p.backend : backend;
  state->timeout = p.timeout;
  state->make_backend = p.make_backend;
  state->pg = p.make_backend(state->backend, c10::make_intrusive<c10d::PrefixStore>("pg", state->store), state->rank,
                             state->size);
  return ProcessGroup(std::move(state));
}

}  // namespace ampp::dist
