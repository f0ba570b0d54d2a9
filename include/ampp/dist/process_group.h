#pragma once
// Process groups for ampp::dist: rendezvous (env://, tcp://, file://) on c10d stores and a c10d
// backend (Gloo on CPU). Mirrors torch.distributed.init_process_group.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ampp::dist {

// PyTorch's default_pg_timeout (C++ kProcessGroupDefaultTimeout): 30 minutes.
inline constexpr std::chrono::milliseconds kDefaultTimeout{30 * 60 * 1000};

struct InitOptions {
  // "gloo" (CPU, always available here), "nccl" or "mpi" (only when LibTorch was built with them).
  TORCH_ARG(std::string, backend) = "gloo";
  // "env://" (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LOCAL_RANK/LOCAL_WORLD_SIZE optional),
  // "tcp://host:port" or "file:///path". A query "?rank=R&world_size=W" overrides rank/world_size.
  TORCH_ARG(std::string, init_method) = "env://";
  // -1: take it from the environment (env://) or the URL query (tcp://, file://).
  TORCH_ARG(int64_t, world_size) = -1;
  TORCH_ARG(int64_t, rank) = -1;
  // Rendezvous, store and collective timeout (Gloo ops fail after it instead of hanging).
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultTimeout;
  // Network interface for Gloo (as GLOO_SOCKET_IFNAME); empty: the address that routes to the master.
  TORCH_ARG(std::string, interface) = "";
  // Make this group the default one (returned by default_group(), used by DistributedSampler etc.).
  TORCH_ARG(bool, set_default) = true;
  // Check before every collective that all ranks call the same one with the same shapes and dtypes
  // (c10d's ProcessGroupWrapper over a second Gloo group), failing on every rank with a message naming
  // both sides instead of hanging; a rank that never arrives is named after `timeout`. nullopt: on when
  // TORCH_DISTRIBUTED_DEBUG=DETAIL, as in PyTorch. Costs a fingerprint allgather per collective.
  TORCH_ARG(std::optional<bool>, check_collectives) = std::nullopt;
};

// A shared handle to an initialised process group (cheap to copy). rank()/size() are the global
// rank and world size; local_rank()/local_size() come from LOCAL_RANK/LOCAL_WORLD_SIZE when set.
class ProcessGroup {
 public:
  struct State;
  ProcessGroup() = default;
  explicit ProcessGroup(std::shared_ptr<const State> state) : state_(std::move(state)) {}

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  const std::string& backend() const;
  std::chrono::milliseconds timeout() const;
  // The underlying c10d objects, for collectives ampp does not wrap.
  const c10::intrusive_ptr<c10d::ProcessGroup>& c10d() const;
  const c10::intrusive_ptr<c10d::Store>& store() const;
  explicit operator bool() const { return state_ != nullptr; }

  // Blocks until every rank reaches it (fails after timeout()).
  void barrier() const;

 private:
  friend ProcessGroup new_group(const ProcessGroup& parent, std::vector<int> ranks, const std::string& backend);
  const State& state() const;
  std::shared_ptr<const State> state_;
};

struct ProcessGroup::State {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  c10::intrusive_ptr<c10d::Store> store;
  std::string backend;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // A backend of the named kind ("gloo", "nccl") with this group's devices, timeout and checks, for `size`
  // ranks meeting in `store`: how new_group builds subgroups. Empty for wrap_process_group's groups.
  std::function<c10::intrusive_ptr<c10d::ProcessGroup>(
      const std::string& backend, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)>
      make_backend;
  mutable std::atomic<int> subgroups_made{0};  // new_group's count, which names each subgroup's keys
};

// Rendezvous and create the group; see InitOptions. Errors name the missing/malformed setting and
// the fix. Calling it twice while a default group exists is an error (as in PyTorch).
ProcessGroup init_process_group(const InitOptions& options = {});

// Wrap an existing c10d group (e.g. built by hand on a c10d::HashStore) without rendezvous.
ProcessGroup wrap_process_group(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::intrusive_ptr<c10d::Store> store = {},
                                std::chrono::milliseconds timeout = kDefaultTimeout);

// torch.distributed.new_group: a group of some of `parent`'s ranks (each at most once, any order), numbered
// in ascending order of their rank in `parent`, with parent's backend, devices and timeout. A collective
// over `parent`: every rank of it calls new_group, its new_group calls in the same order (they are numbered
// to keep their keys in the store apart). A rank not in `ranks` gets an empty ProcessGroup. In the new
// group local_rank()/local_size() equal rank()/size(). `backend` ("gloo", "nccl"; "" = the parent's) is
// new_group's backend argument: e.g. NCCL for the gradients of a job whose default group is Gloo.
ProcessGroup new_group(const ProcessGroup& parent, std::vector<int> ranks, const std::string& backend = "");

bool is_initialized();
// The default group; error if init_process_group() has not been called.
ProcessGroup default_group();
int get_rank();
int get_world_size();
// Forget the default group (the c10d objects die when the last handle goes).
void destroy_process_group();

// Whether this LibTorch build provides the backend ("gloo", "nccl", "mpi").
bool is_backend_available(const std::string& backend);

}  // namespace ampp::dist
