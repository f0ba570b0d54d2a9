#include <ampp/util/launch_environment.h>
#include <ampp/util/parse_number.h>

#include <c10/util/Exception.h>

#include <cstdlib>

namespace ampp {
namespace {

std::optional<std::string> variable(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int64_t number(const std::optional<std::string>& text, const char* name, int64_t unset, int64_t min_value) {
  if (!text) return unset;
  const auto v = parse_int(*text);
  TORCH_CHECK(v && *v >= min_value, "environment variable ", name, "='", *text, "' is not an integer >= ", min_value,
              "; it is set by the launcher (ampp run, torchrun)");
  return *v;
}

}  // namespace

int64_t LaunchEnvironment::world_size_number() const { return number(world_size, "WORLD_SIZE", 1, 1); }

int64_t LaunchEnvironment::restart_count_number() const {
  return number(restart_count, "TORCHELASTIC_RESTART_COUNT", 0, 0);
}

LaunchEnvironment launch_environment() {
  LaunchEnvironment e;
  e.rank = variable("RANK");
  e.world_size = variable("WORLD_SIZE");
  e.local_rank = variable("LOCAL_RANK");
  e.local_world_size = variable("LOCAL_WORLD_SIZE");
  e.master_addr = variable("MASTER_ADDR");
  e.master_port = variable("MASTER_PORT");
  e.restart_count = variable("TORCHELASTIC_RESTART_COUNT");
  e.use_agent_store = variable("TORCHELASTIC_USE_AGENT_STORE");
  return e;
}

}  // namespace ampp
