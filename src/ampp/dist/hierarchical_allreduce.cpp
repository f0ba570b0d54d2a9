// Machines from an allgather of machine ids; per bucket: a shared-memory sum within the machine, a Gloo
// allreduce between the leaders, a shared-memory broadcast from each leader.
#include <ampp/dist/hierarchical_allreduce.h>
#include <ampp/dist/reducer.h>
#include <ampp/dist/shared_memory_allreduce.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include <fmt/format.h>

namespace ampp::dist {
namespace {

constexpr int64_t kMachineIdBytes = 256;
constexpr int64_t kLeaderBroadcastChunk = 250LL << 20;  // as DDP's own buffer broadcast

std::string first_line_of(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::vector<std::string> allgather_machine_ids(const ProcessGroup& world, const std::string& id) {
  auto mine = torch::zeros({kMachineIdBytes}, torch::kByte);
  std::memcpy(mine.data_ptr(), id.data(), id.size());
  std::vector<torch::Tensor> in{mine};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < world.size(); ++r) out[0].push_back(torch::empty_like(mine));
  world.c10d()->allgather(out, in)->wait();
  std::vector<std::string> ids;
  for (const auto& t : out[0]) ids.emplace_back(reinterpret_cast<const char*>(t.data_ptr()));
  return ids;
}

}  // namespace

std::string this_machine_id() {
  if (const char* forced = std::getenv("AMPP_MACHINE_ID"); forced && *forced) return forced;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  struct stat shm{};
  const bool has_shm = ::stat("/dev/shm", &shm) == 0;
  return fmt::format("{}/{}/{}", host, first_line_of("/proc/sys/kernel/random/boot_id"),
                     has_shm ? std::to_string(shm.st_dev) : std::string("no-/dev/shm"));
}

std::pair<int, int> MachineGroups::place_of(int rank) const {
  for (size_t m = 0; m < ranks_of_machine.size(); ++m)
    for (size_t k = 0; k < ranks_of_machine[m].size(); ++k)
      if (ranks_of_machine[m][k] == rank) return {static_cast<int>(m), static_cast<int>(k)};
  TORCH_CHECK(false, "ampp::dist::MachineGroups: rank ", rank, " is not one of the world's ", world.size(), " ranks.");
}

MachineGroups group_by_machine(const ProcessGroup& world, const std::string& machine_id) {
  TORCH_CHECK(world, "ampp::dist::group_by_machine needs an initialised process group.");
  TORCH_CHECK(!machine_id.empty() && static_cast<int64_t>(machine_id.size()) < kMachineIdBytes,
              "ampp::dist::group_by_machine: the machine id must have 1 to ", kMachineIdBytes - 1,
              " characters (check AMPP_MACHINE_ID); got ", machine_id.size(), ".");
  const auto ids = allgather_machine_ids(world, machine_id);
  MachineGroups g;
  g.world = world;
  std::map<std::string, int> index;  // machines in the order of their lowest rank
  for (int r = 0; r < world.size(); ++r) {
    const auto [it, fresh] = index.emplace(ids[static_cast<size_t>(r)], g.machines());
    if (fresh) g.ranks_of_machine.emplace_back();
    g.ranks_of_machine[static_cast<size_t>(it->second)].push_back(r);
  }
  g.machine_index = index.at(ids[static_cast<size_t>(world.rank())]);
  if (g.machines() == 1) {
    g.machine = world;
    return g;
  }
  std::vector<int> leaders;
  for (int m = 0; m < g.machines(); ++m) {  // every rank takes part in every new_group
    const auto& ranks = g.ranks_of_machine[static_cast<size_t>(m)];
    auto group = new_group(world, ranks);
    if (m == g.machine_index) g.machine = group;
    leaders.push_back(ranks.front());
  }
  g.leaders = new_group(world, leaders);
  return g;
}

CommHook hierarchical_allreduce_hook(const MachineGroups& groups) {
  if (groups.machines() == 1) return shared_memory_allreduce_hook(groups.world);
  if (groups.machines() == groups.world.size()) return allreduce_hook(groups.world);
  auto segment = std::make_shared<std::unique_ptr<SharedMemoryAllreduce>>();
  return [g = groups, segment](GradBucket& bucket) {
    torch::NoGradGuard no_grad;
    torch::Tensor buffer = bucket.buffer();
    const bool shares = g.machine.size() > 1;
    auto* shm = shares
                    ? &sized_segment(*segment, g.machine, buffer.numel() * buffer.element_size(), kMinimumBucketSegment)
                    : nullptr;
    buffer.div_(g.world.size());
    if (shm) shm->sum_(buffer);                                             // this machine's sum, on each of its ranks
    if (g.leaders) allreduce_sum_async(g.leaders, buffer)->waitAndThrow();  // the machines' sums, on the leaders
    if (shm) shm->broadcast_({buffer}, 0);                                  // the leader's total, bit for bit
    return completed_future(buffer);
  };
}

BufferBroadcast hierarchical_buffer_broadcast(const MachineGroups& groups) {
  if (groups.machines() == 1) return shared_memory_buffer_broadcast(groups.world);
  auto segment = std::make_shared<std::unique_ptr<SharedMemoryAllreduce>>();
  return [g = groups, segment](const std::vector<torch::Tensor>& buffers, int source) {
    const auto [source_machine, source_in_machine] = g.place_of(source);
    const bool on_source_machine = g.machine_index == source_machine;
    auto within_machine = [&](int root) {
      if (g.machine.size() == 1) return;
      sized_segment(*segment, g.machine, SharedMemoryAllreduce::broadcast_bytes(buffers), kMinimumBufferSegment)
          .broadcast_(buffers, root);
    };
    if (on_source_machine) within_machine(source_in_machine);  // the source's leader gets them first
    if (g.leaders) broadcast_coalesced(g.leaders, buffers, kLeaderBroadcastChunk, source_machine);
    if (!on_source_machine) within_machine(0);
  };
}

}  // namespace ampp::dist
