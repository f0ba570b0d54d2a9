// init_process_group: successful rendezvous forms and every error the issue lists.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include <torch/torch.h>

#include <ampp/dist/process_group.h>

#include "dist/multiprocess.h"

using namespace ampp::dist;
using namespace ampp_test;
using namespace std::chrono_literals;

namespace {

std::string init_error(const InitOptions& o) {
  try {
    init_process_group(o);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  destroy_process_group();
  return "<no error>";
}

void clear_env() {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    unsetenv(v);
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

}  // namespace

TEST(Rendezvous, EnvMissingVariableNamesItAndTheFix) {
  clear_env();
  setenv("WORLD_SIZE", "2", 1);
  const auto msg = init_error(InitOptions());
  EXPECT_HAS(msg, "environment variable RANK expected, but not set");
  EXPECT_HAS(msg, "ampp run");
  setenv("RANK", "0", 1);
  EXPECT_HAS(init_error(InitOptions()), "MASTER_ADDR expected, but not set");
  clear_env();
}

TEST(Rendezvous, EnvMalformedVariable) {
  clear_env();
  setenv("RANK", "zero", 1);
  setenv("WORLD_SIZE", "2", 1);
  EXPECT_HAS(init_error(InitOptions()), "environment variable RANK='zero' is not an integer");
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "0", 1);
  EXPECT_HAS(init_error(InitOptions()), "WORLD_SIZE=0 is out of range");
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "70000", 1);
  EXPECT_HAS(init_error(InitOptions().timeout(1s)), "port 70000");
  setenv("MASTER_PORT", "29500", 1);
  setenv("RANK", "2", 1);
  EXPECT_HAS(init_error(InitOptions()), "rank 2 is out of range for world_size 2");
  clear_env();
}

TEST(Rendezvous, UrlErrors) {
  EXPECT_HAS(init_error(InitOptions().init_method("tcp://127.0.0.1:1234").world_size(2)), "rank parameter missing");
  EXPECT_HAS(init_error(InitOptions().init_method("tcp://127.0.0.1:1234").rank(0)), "world size parameter missing");
  EXPECT_HAS(init_error(InitOptions().init_method("tcp://127.0.0.1").rank(0).world_size(1)), "port number missing");
  EXPECT_HAS(init_error(InitOptions().init_method("file://").rank(0).world_size(1)), "path missing");
  EXPECT_HAS(init_error(InitOptions().init_method("udp://x:1").rank(0).world_size(1)), "unsupported init_method");
  EXPECT_HAS(init_error(InitOptions().init_method("tcp://127.0.0.1:1?rank=x&world_size=2")), "rank in");
}

TEST(Rendezvous, UnavailableBackendSaysSo) {
  const auto msg = init_error(InitOptions().backend("nccl").init_method("tcp://127.0.0.1:1").rank(0).world_size(1));
  // A CUDA LibTorch has NCCL (torch.distributed.is_nccl_available()); without a GPU it still cannot run.
  const bool nccl_built = AMPP_TEST_TORCH_HAS_CUDA;
  if (!nccl_built) EXPECT_HAS(msg, "backend 'nccl' is not available in this LibTorch build");
  if (nccl_built && !torch::cuda::is_available()) EXPECT_HAS(msg, "backend \"nccl\" needs a CUDA GPU");
  EXPECT_HAS(msg, "gloo");
  EXPECT_HAS(init_error(InitOptions().backend("mpi").init_method("tcp://127.0.0.1:1").rank(0).world_size(1)),
             "not available");
  EXPECT_HAS(init_error(InitOptions().backend("foo").init_method("tcp://127.0.0.1:1").rank(0).world_size(1)),
             "unknown backend 'foo'");
  EXPECT_EQ(is_backend_available("nccl"), AMPP_TEST_TORCH_HAS_CUDA);
  EXPECT_TRUE(is_backend_available("gloo"));
}

TEST(Rendezvous, DefaultTimeoutIsThirtyMinutes) {
  EXPECT_EQ(InitOptions().timeout(), std::chrono::minutes(30));
  EXPECT_EQ(InitOptions().backend(), "gloo");
  EXPECT_EQ(InitOptions().init_method(), "env://");
}

TEST(Rendezvous, PortAlreadyInUse) {
  // Hold a listening socket on the port, then ask rank 0 to serve the store there.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const auto msg = init_error(
      InitOptions().init_method("tcp://127.0.0.1:" + std::to_string(port)).rank(0).world_size(2).timeout(2s));
  close(fd);
  EXPECT_HAS(msg, "already in use");
  EXPECT_HAS(msg, std::to_string(port));
}

TEST(Rendezvous, MasterUnreachableWithinTimeout) {
  const int port = free_port();  // nobody listens there
  const auto start = std::chrono::steady_clock::now();
  const auto msg = init_error(
      InitOptions().init_method("tcp://127.0.0.1:" + std::to_string(port)).rank(1).world_size(2).timeout(1s));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_HAS(msg, "could not reach the master at 127.0.0.1:" + std::to_string(port));
  EXPECT_LT(elapsed, 10s);
}

TEST(Rendezvous, TcpTwoRanksAllreduce) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = init_tcp(rank, 2, port);
    EXPECT_EQ(pg.rank(), rank);
    EXPECT_EQ(pg.size(), 2);
    EXPECT_EQ(get_world_size(), 2);
    std::vector<torch::Tensor> t{torch::full({3}, rank + 1.0)};
    pg.c10d()->allreduce(t)->wait();
    EXPECT_TRUE(t[0].equal(torch::full({3}, 3.0)));
    // A second init while the default group exists is an error, as in PyTorch.
    EXPECT_THROW(init_tcp(rank, 2, port), c10::Error);
  }));
}

TEST(Rendezvous, EnvTwoRanksAsTorchrunSetsThem) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    auto pg = init_process_group();
    EXPECT_EQ(pg.rank(), rank);
    EXPECT_EQ(pg.local_rank(), rank);
    EXPECT_EQ(pg.local_size(), 2);
    EXPECT_EQ(pg.timeout(), std::chrono::minutes(30));
    pg.barrier();
  }));
}

// Rank 0 never comes: a timeout, named as one (not as a lost connection), on every LibTorch.
TEST(Rendezvous, MissingRankZeroIsATimeout) {
  const auto path = std::filesystem::temp_directory_path() / ("ampp_rdzv_" + std::to_string(free_port()));
  std::filesystem::remove(path);
  const auto msg =
      init_error(InitOptions().init_method("file://" + path.string() + "?world_size=2&rank=1").timeout(1s));
  std::filesystem::remove(path);
  EXPECT_HAS(msg, "rank 1 timed out after 1s waiting for rank 0 to join the rendezvous");
}

TEST(Rendezvous, FileTwoRanks) {
  const auto path = std::filesystem::temp_directory_path() / ("ampp_rdzv_" + std::to_string(free_port()));
  std::filesystem::remove(path);
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg =
        init_process_group(InitOptions()
                               .init_method("file://" + path.string() + "?world_size=2&rank=" + std::to_string(rank))
                               .timeout(20s));
    std::vector<torch::Tensor> t{torch::full({2}, rank == 0 ? 5.0 : 7.0)};
    pg.c10d()->allreduce(t)->wait();
    EXPECT_TRUE(t[0].equal(torch::full({2}, 12.0)));
  }));
  std::filesystem::remove(path);
}

TEST(Rendezvous, WorldSizeMismatchFailsEveryRankFast) {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  expect_all_ok(run_ranks(2, [&](int rank) {
    try {
      init_tcp(rank, rank == 0 ? 2 : 3, port, 20s);
      ADD_FAILURE() << "rank " << rank << ": expected a world-size mismatch error";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_HAS(msg, "world-size mismatch: rank 1 was started with WORLD_SIZE=3 but rank 0 with WORLD_SIZE=2");
    }
  }));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "mismatch must not wait for the 20 s timeout";
}

TEST(Rendezvous, DuplicateRankIsReported) {
  const int port = free_port();
  expect_all_ok(run_ranks(3, [&](int proc) {
    const int rank = proc == 2 ? 1 : proc;  // two processes claim rank 1
    try {
      init_tcp(rank, 3, port, 5s);
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      // The duplicate reports it; the others see the shared error, or lose the store when rank 0
      // exits after reporting it.
      EXPECT_TRUE(msg.find("rank 1 was started twice") != std::string::npos ||
                  msg.find("lost the connection to the rendezvous store") != std::string::npos)
          << msg;
    }
  }));
}

TEST(Rendezvous, HungPeerTimesOutWithinConfiguredTimeout) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = init_tcp(rank, 2, port, 2s);
    if (rank == 1) {
      std::this_thread::sleep_for(3s);  // never joins the collective
      return;
    }
    std::vector<torch::Tensor> t{torch::ones({4})};
    const auto start = std::chrono::steady_clock::now();
    try {
      pg.c10d()->allreduce(t)->wait();
      ADD_FAILURE() << "allreduce with a hung peer must fail";
    } catch (const std::exception& e) {
      const auto elapsed = std::chrono::steady_clock::now() - start;
      EXPECT_GE(elapsed, 1500ms);
      EXPECT_LT(elapsed, 5s) << "timeout is 2 s";
      EXPECT_NE(std::string(e.what()).find("imed out"), std::string::npos) << e.what();
    }
  }));
}
