#pragma once
// What a launcher (`ampp run`, torchrun, torch.distributed.launch, ampp::dist::spawn) tells a worker through
// its environment. The one reader of those variables: the process group, `ampp train` and the CLI ask here.
#include <cstdint>
#include <optional>
#include <string>

namespace ampp {

struct LaunchEnvironment {
  // Each variable as set; nullopt when unset or empty (as PyTorch treats an empty one).
  std::optional<std::string> rank;              // RANK
  std::optional<std::string> world_size;        // WORLD_SIZE
  std::optional<std::string> local_rank;        // LOCAL_RANK
  std::optional<std::string> local_world_size;  // LOCAL_WORLD_SIZE
  std::optional<std::string> master_addr;       // MASTER_ADDR
  std::optional<std::string> master_port;       // MASTER_PORT
  std::optional<std::string> restart_count;     // TORCHELASTIC_RESTART_COUNT (torchrun, `ampp run --max-restarts`)
  std::optional<std::string> use_agent_store;   // TORCHELASTIC_USE_AGENT_STORE

  // This process is a launcher's worker (WORLD_SIZE is set, even to 1).
  bool launched() const { return world_size.has_value(); }
  // WORLD_SIZE as a number, 1 when unset; throws naming the variable when it is not an integer >= 1.
  int64_t world_size_number() const;
  // TORCHELASTIC_RESTART_COUNT as a number, 0 when unset; throws naming the variable when malformed.
  int64_t restart_count_number() const;
};

// Reads the variables now.
LaunchEnvironment launch_environment();

}  // namespace ampp
