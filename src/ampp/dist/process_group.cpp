// init_process_group: parse the init method, build a c10d store, check that every rank agrees on
// the world size (through the store, so a mismatch is an error instead of a hang), then create
// the backend. All transport is c10d's.
#include <ampp/dist/process_group.h>
#include <ampp/util/launch_environment.h>
#include <ampp/util/parse_number.h>

#include "log_format.h"
#include "torch_compat.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include <c10/util/Logging.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace ampp::dist {
namespace {

constexpr const char* kLaunchHint =
    "Launch with `ampp run --nproc-per-node N -- <program>` (or torchrun), export RANK, WORLD_SIZE, "
    "MASTER_ADDR and MASTER_PORT yourself, or use init_method tcp://host:port with explicit "
    "InitOptions().rank(r).world_size(w)";

std::mutex g_mutex;
ProcessGroup g_default;

struct Url {
  std::string scheme, host, path;
  int port = -1;
  std::map<std::string, std::string> query;
};

// An integer setting of at least `min_value`; `what` names it in the error ("environment variable RANK").
int64_t parse_int(const std::string& what, const std::string& text, int64_t min_value) {
  const auto v = ampp::parse_int(text);
  TORCH_CHECK(v, "ampp::dist::init_process_group: ", what, "='", text,
              "' is not an integer. Set it to a whole number >= ", min_value, ".");
  TORCH_CHECK(*v >= min_value, "ampp::dist::init_process_group: ", what, "=", *v,
              " is out of range; it must be >= ", min_value, ".");
  return *v;
}

const char* getenv_nonempty(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

std::string require_env(const std::optional<std::string>& value, const char* name) {
  TORCH_CHECK(value, "ampp::dist::init_process_group(env://): environment variable ", name, " expected, but not set. ",
              kLaunchHint, ".");
  return *value;
}

Url parse_url(const std::string& method) {
  Url u;
  const auto sep = method.find("://");
  TORCH_CHECK(sep != std::string::npos, "ampp::dist::init_process_group: init_method '", method,
              "' is not a URL. Use env://, tcp://host:port or file:///path.");
  u.scheme = method.substr(0, sep);
  std::string rest = method.substr(sep + 3);
  if (const auto q = rest.find('?'); q != std::string::npos) {
    std::string query = rest.substr(q + 1);
    rest.resize(q);
    size_t pos = 0;
    while (pos <= query.size()) {
      const auto amp = query.find('&', pos);
      const std::string kv = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
      if (!kv.empty()) {
        const auto eq = kv.find('=');
        TORCH_CHECK(eq != std::string::npos, "ampp::dist::init_process_group: query item '", kv, "' in '", method,
                    "' has no '='; write ?rank=R&world_size=W.");
        u.query[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      if (amp == std::string::npos) break;
      pos = amp + 1;
    }
  }
  if (u.scheme == "tcp") {
    std::string hostport = rest;
    if (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
    const auto colon = hostport.rfind(':');
    TORCH_CHECK(colon != std::string::npos && colon + 1 < hostport.size(),
                "ampp::dist::init_process_group: port number missing in '", method,
                "'. Write tcp://host:port, e.g. tcp://127.0.0.1:29500.");
    u.host = hostport.substr(0, colon);
    if (u.host.size() >= 2 && u.host.front() == '[' && u.host.back() == ']')
      u.host = u.host.substr(1, u.host.size() - 2);  // [ipv6]
    TORCH_CHECK(!u.host.empty(), "ampp::dist::init_process_group: host missing in '", method,
                "'. Write tcp://host:port.");
    u.port = static_cast<int>(parse_int("the port in '" + method + "'", hostport.substr(colon + 1), 0));
  } else if (u.scheme == "file") {
    u.path = rest;
    TORCH_CHECK(!u.path.empty(), "ampp::dist::init_process_group: path missing in '", method,
                "'. Write file:///shared/path/rendezvous (a file visible to every rank).");
  } else {
    TORCH_CHECK(u.scheme == "env", "ampp::dist::init_process_group: unsupported init_method scheme '", u.scheme,
                "://'. Use env://, tcp://host:port or file:///path.");
  }
  return u;
}

// The local IPv4/IPv6 address this host uses to reach `host` (no packet is sent: a UDP connect
// only consults the routing table). Gloo must listen on an address peers can reach; binding to
// the hostname's address fails in containers and network namespaces.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port > 0 ? port : 1).c_str(), &hints, &res) != 0 || !res) return {};
  std::string out;
  const int fd = socket(res->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char buf[INET6_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      if (local.ss_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&local)->sin_addr, buf, sizeof(buf));
      else
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr, buf, sizeof(buf));
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

std::string seconds(std::chrono::milliseconds t) { return fmt::format("{:g}s", t.count() / 1000.0); }

// c10d's message without LibTorch's "Exception raised from ..." backtrace: the first line.
std::string first_line_of(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = error ? error->what_without_backtrace() : e.what();
  return what.substr(0, what.find('\n'));
}

// c10d logs every failed connect attempt with a C++ backtrace on stderr; ampp reports the failure
// itself, in one line, so LibTorch's log shows only FATAL messages while a client connects.
class QuietLibTorchLog {
 public:
  QuietLibTorchLog() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = 3; }  // 3: FATAL
  ~QuietLibTorchLog() { FLAGS_caffe2_log_level = saved_; }
  QuietLibTorchLog(const QuietLibTorchLog&) = delete;
  QuietLibTorchLog& operator=(const QuietLibTorchLog&) = delete;

 private:
  int saved_;
};

// A client's TCPStore tries to connect twice, each time for the whole timeout (LibTorch 2.x; 1.13
// once), so a missing master took twice the timeout to report: each try gets its share, then the
// store's operations get the whole timeout back.
c10::intrusive_ptr<c10d::Store> connect_tcp_store(const std::string& host, c10d::TCPStoreOptions o) {
  const auto timeout = o.timeout;
  if (o.isServer) return c10::make_intrusive<c10d::TCPStore>(host, o);
  o.timeout = std::max(timeout / compat::kTcpStoreConnectTries, std::chrono::milliseconds(1));
  QuietLibTorchLog quiet;
  auto store = c10::make_intrusive<c10d::TCPStore>(host, o);
  store->setTimeout(timeout);
  return store;
}

// rank 0 hosts the store; rank -1 connects as a client only (the store's host is torchrun's agent).
c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, int port, int rank,
                                               std::chrono::milliseconds timeout, const std::string& origin) {
  TORCH_CHECK(port <= 65535, "ampp::dist::init_process_group: port ", port, " (", origin,
              ") is out of range; use a port in 1..65535.");
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = rank == 0;
  o.numWorkers = c10::nullopt;  // ampp checks arrival itself (world-size mismatch -> error, not hang)
  o.waitWorkers = false;
  o.timeout = timeout;
  o.multiTenant = true;
  try {
    return connect_tcp_store(host, o);
  } catch (const std::exception& e) {
    const std::string what = first_line_of(e);
    if (rank == 0) {
      const bool in_use = compat::is_address_in_use(what);
      TORCH_CHECK(!in_use, "ampp::dist::init_process_group: rank 0 cannot listen on port ", port, " (", origin,
                  "): the port is already in use (another job or a leftover process holds it). "
                  "Pick a free port (MASTER_PORT / tcp://host:PORT, `ampp run --master-port`) or stop "
                  "the other process. c10d said: ",
                  what);
      TORCH_CHECK(false, "ampp::dist::init_process_group: rank 0 could not start the rendezvous store on port ", port,
                  " (", origin, "). c10d said: ", what);
    }
    TORCH_CHECK(false, "ampp::dist::init_process_group: ", rank >= 0 ? c10::str("rank ", rank) : "this worker",
                " could not reach the master at ", host, ":", port, " (", origin, ") within the timeout of ",
                seconds(timeout),
                ". Check that rank 0 is running, that MASTER_ADDR/MASTER_PORT (or the tcp:// URL) name rank 0's "
                "host and port and are reachable from this host, or raise the timeout if ranks start far apart. "
                "c10d said: ",
                what);
  }
}

// Store I/O failed because the store's host (rank 0) went away, not because of a timeout.
void lost_store(int rank, int world, const std::string& what) {
  TORCH_CHECK(false, "ampp::dist::init_process_group: rank ", rank,
              " lost the connection to the rendezvous store "
              "while waiting for all ",
              world,
              " ranks: rank 0 (the store's host) probably exited, e.g. after an "
              "error in another rank (see its message). c10d said: ",
              what);
}

// Every rank checks in; rank 0 publishes its world size. Each rank compares, and any disagreement
// (world size, duplicate rank, too many ranks) is written to an error key that every rank polls,
// so all ranks fail fast with the same message instead of timing out in the backend.
void check_membership_impl(c10d::Store& store, int rank, int world, std::chrono::milliseconds timeout) {
  const std::string kWorld = "ampp/init/world_size", kArrived = "ampp/init/arrived", kError = "ampp/init/error";
  auto to_bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  auto fail = [&](const std::string& msg) {
    store.set(kError, to_bytes(msg));
    TORCH_CHECK(false, msg);
  };
  if (rank == 0) store.set(kWorld, to_bytes(std::to_string(world)));
  const auto dup = store.add(fmt::format("ampp/init/rank/{}", rank), 1);
  if (dup > 1)
    fail(
        fmt::format("ampp::dist::init_process_group: rank {} was started twice (world_size={}). Give every "
                    "process a distinct RANK in 0..WORLD_SIZE-1; with file:// also delete a rendezvous file "
                    "left over from an earlier run.",
                    rank, world));
  std::vector<uint8_t> w0_bytes;
  try {
    w0_bytes = store.get(kWorld);  // waits (store timeout) for rank 0
  } catch (const std::exception& e) {
    // A closed connection (rank 0 exited after reporting an error) is not a timeout. (c10::Error's
    // what() carries a backtrace whose frames must not be read as the message.)
    const std::string what = first_line_of(e);
    if (!compat::is_store_timeout(what)) lost_store(rank, world, what);
    TORCH_CHECK(false, "ampp::dist::init_process_group: rank ", rank, " timed out after ", seconds(timeout),
                " waiting for rank 0 to join the rendezvous. Start a process with RANK=0, or raise the "
                "timeout. c10d said: ",
                what);
  }
  const int w0 = std::atoi(std::string(w0_bytes.begin(), w0_bytes.end()).c_str());
  if (w0 != world)
    fail(
        fmt::format("ampp::dist::init_process_group: world-size mismatch: rank {} was started with "
                    "WORLD_SIZE={} but rank 0 with WORLD_SIZE={}. Start every rank with the same world size.",
                    rank, world, w0));
  const auto arrived = store.add(kArrived, 1);
  if (arrived > world)
    fail(
        fmt::format("ampp::dist::init_process_group: more processes ({}) joined than WORLD_SIZE={}. Start "
                    "exactly WORLD_SIZE ranks; with file:// delete a rendezvous file left over from an "
                    "earlier run.",
                    arrived, world));
  const auto start = std::chrono::steady_clock::now();
  for (int64_t n = arrived;; n = store.add(kArrived, 0)) {
    if (store.check({kError})) {
      const auto msg = store.get(kError);
      TORCH_CHECK(false, std::string(msg.begin(), msg.end()), " (reported to rank ", rank, ")");
    }
    if (n == world) break;
    TORCH_CHECK(n < world, "ampp::dist::init_process_group: more processes (", n, ") joined than WORLD_SIZE=", world,
                ". Start exactly WORLD_SIZE ranks.");
    TORCH_CHECK(std::chrono::steady_clock::now() - start < timeout, "ampp::dist::init_process_group: rank ", rank,
                " timed out after ", seconds(timeout), " waiting for all ", world, " ranks (", n,
                " arrived). Start the missing ranks, check that they use the same master address/port, or raise "
                "the timeout.");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Store I/O fails with a plain socket error when the master (rank 0, which serves the store) exits,
// typically because another rank hit an error first: say so instead of "Broken pipe".
void check_membership(c10d::Store& store, int rank, int world, std::chrono::milliseconds timeout) {
  try {
    check_membership_impl(store, rank, world, timeout);
  } catch (const c10::Error& e) {
    // ampp's own errors pass through; 2.x reports store I/O as c10::DistNetworkError, a c10::Error.
    if (std::string(e.what_without_backtrace()).rfind("ampp::", 0) == 0) throw;
    lost_store(rank, world, first_line_of(e));
  } catch (const std::exception& e) {
    lost_store(rank, world, first_line_of(e));
  }
}

// TORCH_DISTRIBUTED_DEBUG=DETAIL turns the collective checks on unless InitOptions says otherwise.
bool checks_collectives(const InitOptions& options) {
  if (options.check_collectives()) return *options.check_collectives();
  const char* level = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  return level && std::string(level) == "DETAIL";
}

c10::intrusive_ptr<c10d::ProcessGroup> make_backend(const std::string& backend,
                                                    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& device_address, const std::string& interface,
                                                    bool check_collectives = false) {
  if (backend == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    if (!interface.empty())
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    else if (!device_address.empty())
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(device_address));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    c10::intrusive_ptr<c10d::ProcessGroupGloo> checker;
    if (check_collectives)  // its own keys in the store, the same devices and timeout
      checker = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("collective_checks", store), rank, world, opts);
    return compat::make_gloo_process_group(store, rank, world, opts, checker);
  }
  TORCH_CHECK(backend == "nccl" || backend == "mpi", "ampp::dist::init_process_group: unknown backend '", backend,
              "'. Use \"gloo\" (CPU), \"nccl\" (CUDA) or \"mpi\".");
#if AMPP_HAVE_NCCL
  if (backend == "nccl") {
    TORCH_CHECK(torch::cuda::is_available(),
                "ampp::dist::init_process_group: backend \"nccl\" needs a CUDA GPU, "
                "and this process sees none (torch::cuda::is_available() is false; CUDA_VISIBLE_DEVICES='",
                std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "", "'). Use \"gloo\".");
    return compat::make_nccl_process_group(store, rank, world, timeout);
  }
#endif
  TORCH_CHECK(false, "ampp::dist::init_process_group: backend '", backend,
              "' is not available in this LibTorch build (it was built without ", backend == "nccl" ? "NCCL" : "MPI",
              " support; Debian's libtorch is CPU-only with Gloo). Use backend \"gloo\", or link ampp against a "
              "LibTorch built with ",
              backend == "nccl" ? "USE_NCCL=1" : "USE_MPI=1", ".");
}

}  // namespace

int ProcessGroup::rank() const { return state().rank; }
int ProcessGroup::size() const { return state().size; }
int ProcessGroup::local_rank() const { return state().local_rank; }
int ProcessGroup::local_size() const { return state().local_size; }
const std::string& ProcessGroup::backend() const { return state().backend; }
std::chrono::milliseconds ProcessGroup::timeout() const { return state().timeout; }
const c10::intrusive_ptr<c10d::ProcessGroup>& ProcessGroup::c10d() const { return state().pg; }
const c10::intrusive_ptr<c10d::Store>& ProcessGroup::store() const { return state().store; }
void ProcessGroup::barrier() const { state().pg->barrier()->wait(); }
const ProcessGroup::State& ProcessGroup::state() const {
  TORCH_CHECK(state_, "ampp::dist::ProcessGroup is empty. Create one with ampp::dist::init_process_group().");
  return *state_;
}

bool is_backend_available(const std::string& backend) {
  return backend == "gloo" || (AMPP_HAVE_NCCL && backend == "nccl");
}

namespace {

// Who this process is and where the rendezvous is, from the options, the URL and the environment.
struct Membership {
  Url url;
  int64_t rank = -1;
  int64_t world = -1;
  int64_t local_rank = 0;
  int64_t local_size = 1;
  std::string master_addr;
  int master_port = -1;
  std::string origin;  // how the rendezvous was given, for error messages
  // torchrun's agent already hosts the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
  // every rank connects as a client, under this attempt's prefix.
  bool agent_store = false;
  std::string agent_prefix;
};

// As PyTorch's env:// rendezvous: "True" exactly. PyTorch 1.x keys each attempt under
// /worker/attempt_<restart count> of one store; 2.x starts a fresh store per attempt and drops the
// prefix. ampp always uses it: harmless on a fresh store, needed on a reused one.
void resolve_agent_store(const LaunchEnvironment& env, Membership& m) {
  m.agent_store = env.use_agent_store == "True";
  if (!m.agent_store) return;
  m.agent_prefix = fmt::format("/worker/attempt_{}", env.restart_count.value_or("0"));
  m.origin += " (torchrun's agent store)";
}

void resolve_rank_and_world(const InitOptions& options, const LaunchEnvironment& env, Membership& m) {
  m.rank = options.rank();
  m.world = options.world_size();
  auto from_query = [&](const char* key, int64_t& value, int64_t min_value) {
    if (auto it = m.url.query.find(key); it != m.url.query.end())
      value = parse_int(fmt::format("{} in '{}'", key, options.init_method()), it->second, min_value);
  };
  from_query("rank", m.rank, 0);
  from_query("world_size", m.world, 1);
  if (m.url.scheme == "env") {
    if (m.rank < 0) m.rank = parse_int("environment variable RANK", require_env(env.rank, "RANK"), 0);
    if (m.world < 0)
      m.world = parse_int("environment variable WORLD_SIZE", require_env(env.world_size, "WORLD_SIZE"), 1);
    m.master_addr = require_env(env.master_addr, "MASTER_ADDR");
    m.master_port =
        static_cast<int>(parse_int("environment variable MASTER_PORT", require_env(env.master_port, "MASTER_PORT"), 0));
    m.origin = fmt::format("env:// MASTER_ADDR={} MASTER_PORT={}", m.master_addr, m.master_port);
    resolve_agent_store(env, m);
  } else {
    TORCH_CHECK(m.rank >= 0, "ampp::dist::init_process_group(", m.url.scheme,
                "://): rank parameter missing. Pass InitOptions().rank(r) or append ?rank=r to the URL.");
    TORCH_CHECK(m.world >= 1, "ampp::dist::init_process_group(", m.url.scheme,
                "://): world size parameter missing. Pass InitOptions().world_size(w) or append ?world_size=w.");
    m.master_addr = m.url.host;
    m.master_port = m.url.port;
    m.origin = options.init_method();
  }
  TORCH_CHECK(m.rank < m.world, "ampp::dist::init_process_group: rank ", m.rank, " is out of range for world_size ",
              m.world, "; ranks are 0..", m.world - 1, ". Fix RANK/WORLD_SIZE (or the rank/world_size options).");
}

// LOCAL_RANK / LOCAL_WORLD_SIZE (torchrun sets both); without them assume one node.
void resolve_local_rank(const LaunchEnvironment& env, Membership& m) {
  m.local_rank = m.rank;
  m.local_size = m.world;
  if (env.local_rank) m.local_rank = parse_int("environment variable LOCAL_RANK", *env.local_rank, 0);
  if (env.local_world_size) m.local_size = parse_int("environment variable LOCAL_WORLD_SIZE", *env.local_world_size, 1);
  TORCH_CHECK(m.local_rank < m.local_size, "ampp::dist::init_process_group: LOCAL_RANK=", m.local_rank,
              " is out of range for LOCAL_WORLD_SIZE=", m.local_size, ". Fix the launcher environment.");
}

Membership resolve_membership(const InitOptions& options) {
  Membership m;
  m.url = parse_url(options.init_method());
  const auto env = launch_environment();  // read once for the whole membership
  resolve_rank_and_world(options, env, m);
  resolve_local_rank(env, m);
  return m;
}

// The rendezvous store (a file or rank 0's TCP store) and the local address that reaches the master.
c10::intrusive_ptr<c10d::Store> open_store(const Membership& m, std::chrono::milliseconds timeout,
                                           std::string& device_address) {
  c10::intrusive_ptr<c10d::Store> store;
  if (m.url.scheme == "file") {
    try {
      store = c10::make_intrusive<c10d::FileStore>(m.url.path, static_cast<int>(m.world));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "ampp::dist::init_process_group: cannot open the rendezvous file '", m.url.path,
                  "'. Use a path in a writable directory visible to every rank. c10d said: ", first_line_of(e));
    }
    store->setTimeout(timeout);
    return store;
  }
  store =
      make_tcp_store(m.master_addr, m.master_port, m.agent_store ? -1 : static_cast<int>(m.rank), timeout, m.origin);
  device_address = local_address_towards(m.master_addr, m.master_port);
  if (m.agent_store) store = c10::make_intrusive<c10d::PrefixStore>(m.agent_prefix, store);
  return store;
}

// Builds this rank's backend for any group of the job: the default one and new_group's subgroups.
using BackendMaker = std::function<c10::intrusive_ptr<c10d::ProcessGroup>(
    const std::string& backend, const c10::intrusive_ptr<c10d::Store>&, int rank, int size)>;

BackendMaker backend_maker(const InitOptions& options, const std::string& device_address) {
  std::string interface = options.interface();
  if (interface.empty())
    if (const char* v = getenv_nonempty("GLOO_SOCKET_IFNAME")) interface = v;
  const bool checks = checks_collectives(options);
  return [options, device_address, interface, checks](
             const std::string& backend, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
    try {
      return make_backend(backend, store, rank, size, options.timeout(), device_address, interface, checks);
    } catch (const c10::Error&) {
      throw;
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "ampp::dist::init_process_group: rank ", rank, " could not connect the ", backend,
                  " backend to its peers within ", seconds(options.timeout()), " (address ",
                  device_address.empty() ? std::string("default") : device_address,
                  "). Check that every rank can reach the others (firewall, GLOO_SOCKET_IFNAME). Gloo said: ",
                  first_line_of(e));
    }
  };
}

void check_init_options(const InitOptions& options) {
  if (options.set_default()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    TORCH_CHECK(!g_default,
                "ampp::dist::init_process_group: trying to initialize the default process group "
                "twice! Call it once per process (or destroy_process_group() first).");
  }
  TORCH_CHECK(options.timeout().count() > 0, "ampp::dist::init_process_group: timeout must be positive (got ",
              options.timeout().count(), " ms); the default is 30 minutes.");
  if (!is_backend_available(options.backend())) make_backend(options.backend(), {}, 0, 1, options.timeout(), "", "");
}

}  // namespace

// resolve who and where -> rendezvous store -> every rank present -> backend connected.
namespace {

// A worker that dies of an uncaught exception would lose what it printed but had not flushed: stdout into
// a launcher's pipe is fully buffered. Flush it (and std::cout) before the previous terminate handler
// prints the exception and aborts.
void flush_output_on_terminate() {
  static std::once_flag once;
  std::call_once(once, [] {
    static const std::terminate_handler previous = std::get_terminate();
    std::set_terminate([] {
      std::cout.flush();
      std::fflush(stdout);
      std::cerr.flush();
      std::fflush(stderr);
      previous ? previous() : std::abort();
    });
  });
}

}  // namespace

ProcessGroup init_process_group(const InitOptions& options) {
  flush_output_on_terminate();
  check_init_options(options);
  const Membership m = resolve_membership(options);
  std::string device_address;
  auto store = open_store(m, options.timeout(), device_address);
  check_membership(*store, static_cast<int>(m.rank), static_cast<int>(m.world), options.timeout());
  auto make = backend_maker(options, device_address);
  auto pg = make(options.backend(), c10::make_intrusive<c10d::PrefixStore>("ampp/pg/default", store),
                 static_cast<int>(m.rank), static_cast<int>(m.world));

  auto state = std::make_shared<ProcessGroup::State>();
  state->pg = pg;
  state->store = store;
  state->backend = options.backend();
  state->rank = static_cast<int>(m.rank);
  state->size = static_cast<int>(m.world);
  state->local_rank = static_cast<int>(m.local_rank);
  state->local_size = static_cast<int>(m.local_size);
  state->timeout = options.timeout();
  state->make_backend = std::move(make);
  ProcessGroup group(std::move(state));
  set_log_rank(group.rank());
  log_info("process group ready: backend={} rank={}/{} init_method={}", group.backend(), group.rank(), group.size(),
           options.init_method());
  if (options.set_default()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_default = group;
  }
  return group;
}

ProcessGroup wrap_process_group(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::intrusive_ptr<c10d::Store> store,
                                std::chrono::milliseconds timeout) {
  TORCH_CHECK(pg, "ampp::dist::wrap_process_group: the c10d process group is null.");
  auto state = std::make_shared<ProcessGroup::State>();
  state->rank = pg->getRank();
  state->size = pg->getSize();
  state->local_rank = state->rank;
  state->local_size = state->size;
  state->backend = pg->getBackendName();
  state->pg = std::move(pg);
  state->store = std::move(store);
  state->timeout = timeout;
  return ProcessGroup(std::move(state));
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<bool>(g_default);
}

ProcessGroup default_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(g_default,
              "Default process group has not been initialized, please make sure to call "
              "ampp::dist::init_process_group().");
  return g_default;
}

int get_rank() { return default_group().rank(); }
int get_world_size() { return default_group().size(); }

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_default = ProcessGroup();
}

}  // namespace ampp::dist
