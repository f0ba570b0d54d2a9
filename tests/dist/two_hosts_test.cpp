// Two "hosts": two network namespaces joined by a veth pair, one rank in each, talking only over
// the veth addresses. Needs root (CI runs as root); skipped with a message otherwise.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sched.h>

#include <cstdlib>

#include <fmt/format.h>
#include <torch/torch.h>

#include <ampp/dist/ddp.h>

#include "dist/multiprocess.h"

using namespace ampp::dist;
using namespace ampp_test;

namespace {

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// Creates namespaces A and B, veth A<->B with 10.213.<k>.1 and .2; removes them on destruction.
struct VethPair {
  std::string ns_a, ns_b, addr_a, addr_b, error;
  explicit VethPair(int k) {
    const int id = static_cast<int>(getpid() % 100000);
    ns_a = fmt::format("ampp_a{}", id);
    ns_b = fmt::format("ampp_b{}", id);
    addr_a = fmt::format("10.213.{}.1", k);
    addr_b = fmt::format("10.213.{}.2", k);
    const std::string va = fmt::format("ampa{}", id), vb = fmt::format("ampb{}", id);
    const std::vector<std::string> steps{
        "ip netns add " + ns_a,
        "ip netns add " + ns_b,
        fmt::format("ip link add {} type veth peer name {}", va, vb),
        fmt::format("ip link set {} netns {}", va, ns_a),
        fmt::format("ip link set {} netns {}", vb, ns_b),
        fmt::format("ip -n {} addr add {}/24 dev {}", ns_a, addr_a, va),
        fmt::format("ip -n {} addr add {}/24 dev {}", ns_b, addr_b, vb),
        fmt::format("ip -n {} link set {} up", ns_a, va),
        fmt::format("ip -n {} link set {} up", ns_b, vb),
        fmt::format("ip -n {} link set lo up", ns_a),
        fmt::format("ip -n {} link set lo up", ns_b),
    };
    for (const auto& s : steps)
      if (sh(s) != 0) {
        error = "`" + s + "` failed";
        break;
      }
  }
  ~VethPair() {
    sh("ip netns del " + ns_a);
    sh("ip netns del " + ns_b);
  }
};

void enter_netns(const std::string& name) {
  const int fd = open(("/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot open /run/netns/", name);
  TORCH_CHECK(setns(fd, CLONE_NEWNET) == 0, "setns(", name, ") failed: ", std::strerror(errno));
  close(fd);
}

torch::nn::Sequential make_two_host_model(int seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 2));
}

struct Batch {
  torch::Tensor x, y;
};

Batch two_host_batch(int step, int rank) {
  auto gen = at::detail::createCPUGenerator(100 * step + rank);
  auto x = torch::randn({4, 8}, gen, torch::kFloat);
  return {x, torch::randn({4, 2}, gen, torch::kFloat)};
}

torch::Tensor flat_params(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : model->parameters()) parts.push_back(p.detach().reshape(-1));
  return torch::cat(parts);
}

// Three SGD steps, with DDP between two ranks or (no ddp) in one process on the union of their
// batches: the mean loss over the union has the gradient DDP averages from the two halves.
torch::Tensor train(torch::nn::Sequential model, DistributedDataParallel<torch::nn::Sequential>* ddp, int rank) {
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    if (ddp) {
      const Batch b = two_host_batch(step, rank);
      torch::mse_loss((*ddp)->forward(b.x), b.y).backward();
    } else {
      const Batch b0 = two_host_batch(step, 0), b1 = two_host_batch(step, 1);
      torch::mse_loss(model->forward(torch::cat({b0.x, b1.x})), torch::cat({b0.y, b1.y})).backward();
    }
    opt.step();
  }
  return flat_params(model);
}

}  // namespace

TEST(TwoHosts, DdpOverVethBetweenNetworkNamespaces) {
  if (geteuid() != 0) GTEST_SKIP() << "two-host test needs root to create network namespaces (`ip netns add`)";
  VethPair net(7);
  if (!net.error.empty())
    GTEST_SKIP() << "network namespaces unavailable here (" << net.error
                 << "); this test needs root, iproute2 and CAP_NET_ADMIN";
  const int port = 29611;
  expect_all_ok(run_ranks(2, [&](int rank) {
    enter_netns(rank == 0 ? net.ns_a : net.ns_b);
    // Each namespace sees only its own address and the veth peer.
    auto pg = init_process_group(InitOptions()
                                     .init_method(fmt::format("tcp://{}:{}", net.addr_a, port))
                                     .rank(rank)
                                     .world_size(2)
                                     .timeout(std::chrono::seconds(20)));
    auto model = make_two_host_model(rank + 1);  // different starts: DDP's broadcast makes them rank 0's
    DistributedDataParallel ddp(model, pg);
    const torch::Tensor params = train(model, &ddp, rank);
    std::vector<torch::Tensor> in{params};
    std::vector<std::vector<torch::Tensor>> out(1, {torch::empty_like(params), torch::empty_like(params)});
    pg.c10d()->allgather(out, in)->wait();
    EXPECT_TRUE(torch::equal(out[0][0], out[0][1])) << "parameters differ between the two hosts";
    // The same training in one process on the union of both batches (rank 0's initial weights).
    const torch::Tensor reference = train(make_two_host_model(1), nullptr, 0);
    const double err = (params - reference).abs().max().item<double>() / reference.abs().max().item<double>();
    EXPECT_LE(err, 1e-5) << "two-host DDP differs from one-process training on the union batch";
  }));
}
