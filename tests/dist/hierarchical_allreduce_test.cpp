// Subgroups (new_group) and the hierarchical reductions over them: ranks on pretend machines (a machine id
// per rank) sum through shared memory within a machine and through Gloo between the machines' leaders;
// every rank gets the same bits, the machine-then-leader order of sums, and the source's buffers exactly.
#include <ampp/dist/hierarchical_allreduce.h>

#include "ampp_test.h"
#include "dist/ddp_test_util.h"

#include <cstdlib>
#include <limits>

namespace {

// The machine of each rank: 0 and 2 share one, 1 and 3 another (interleaved, as no launcher would).
std::string interleaved(int rank) { return rank % 2 == 0 ? "machine-a" : "machine-b"; }

int sum_over(const ProcessGroup& group, int value) {
  std::vector<torch::Tensor> io{torch::tensor({value}, torch::kInt)};
  group.c10d()->allreduce(io)->wait();
  return io[0].item<int>();
}

torch::Tensor bucket_values(int rank, int call, torch::ScalarType dtype) {
  torch::manual_seed(50 * call + rank);
  return torch::randn({1000 + 37 * call}).to(dtype);
}

// What the hook gives ranks 0-3 on machines {0,2} and {1,3}: each machine's sum in rank order, then the
// two leaders' sum (two operands: Gloo's order cannot change the bits); each value divided by 4 first.
torch::Tensor two_machine_total(int call, torch::ScalarType dtype) {
  auto part = [&](int rank) { return bucket_values(rank, call, dtype).div(4); };
  const bool widen = dtype == torch::kBFloat16;  // the shared-memory sum adds 16-bit floats in fp32
  auto machine = [&](int a, int b) { return (part(a).to(torch::kFloat) + part(b)).to(dtype); };
  if (!widen) return part(0).add(part(2)).add(part(1).add(part(3)));
  return (machine(0, 2).to(torch::kFloat) + machine(1, 3)).to(dtype);
}

torch::Tensor reduced_by(const CommHook& hook, torch::Tensor values) {
  GradBucket bucket(0, 1, std::move(values), {}, {}, {});
  return hook(bucket)->value().toTensor();
}

}  // namespace

TEST(NewGroup, MembersAreRenumberedInRankOrderAndOthersGetNoGroup) {
  on_ranks(4, [&](int rank, const ProcessGroup& pg) {
    const auto odd = new_group(pg, {3, 1});
    EXPECT_EQ(static_cast<bool>(odd), rank % 2 == 1);
    if (odd) {
      EXPECT_EQ(odd.size(), 2);
      EXPECT_EQ(odd.rank(), rank / 2);
      EXPECT_EQ(sum_over(odd, rank), 4);  // 1 + 3: only the members
    }
    const auto three = new_group(pg, {0, 1, 2});  // the second subgroup: its own keys in the store
    if (three) {
      EXPECT_EQ(sum_over(three, 1), 3);
      const auto pair = new_group(three, {1, 2});  // a subgroup of a subgroup: collective over `three`
      if (pair) {
        EXPECT_EQ(sum_over(pair, rank), 3);
      }
    }
    EXPECT_EQ(sum_over(pg, 1), 4);  // the parent still works
  });
}

TEST(NewGroup, BadRankListsAndWrappedParentsAreClearErrors) {
  on_ranks(2, [&](int, const ProcessGroup& pg) {
    auto message = [&](const ProcessGroup& parent, std::vector<int> ranks) -> std::string {
      try {
        new_group(parent, std::move(ranks));
      } catch (const c10::Error& e) {
        return e.what_without_backtrace();
      }
      return "no error";
    };
    EXPECT_NE(message(pg, {}).find("list of ranks is empty"), std::string::npos);
    EXPECT_NE(message(pg, {1, 0, 1}).find("rank 1 is listed twice"), std::string::npos);
    EXPECT_NE(message(pg, {0, 2}).find("rank 2 is not in the parent group, whose ranks are 0..1"), std::string::npos);
    const auto wrapped = wrap_process_group(pg.c10d(), pg.store());
    EXPECT_NE(message(wrapped, {0}).find("wrap_process_group"), std::string::npos);
    EXPECT_EQ(sum_over(new_group(pg, {1, 0}), 1), 2);  // the parent can still make subgroups
  });
}

// torch.distributed.new_group(ranks, backend=...): a subgroup with a backend of its own, or an error naming it.
TEST(NewGroup, ABackendOfItsOwnIsBuiltOrRefusedByName) {
  on_ranks(2, [&](int, const ProcessGroup& pg) {
    const auto gloo = new_group(pg, {0, 1}, "gloo");
    EXPECT_EQ(gloo.backend(), "gloo");
    EXPECT_EQ(sum_over(gloo, 1), 2);
    EXPECT_EQ(new_group(pg, {0, 1}).backend(), pg.backend());  // "": the parent's
    AMPP_EXPECT_THROW_WITH(new_group(pg, {0, 1}, "bogus"), "unknown backend 'bogus'");
    // Without a GPU (or in a CPU-only LibTorch) NCCL is refused; with one, the GPU suite builds it.
    if (!torch::cuda::is_available()) {
      AMPP_EXPECT_THROW_WITH(new_group(pg, {0, 1}, "nccl"), "nccl");
    }
    EXPECT_EQ(sum_over(new_group(pg, {1, 0}), 1), 2);  // the failures left the parent able to make subgroups
  });
}

TEST(GroupByMachine, RanksWithOneIdFormAMachineLedByItsLowestRank) {
  on_ranks(4, [&](int rank, const ProcessGroup& pg) {
    const auto g = group_by_machine(pg, interleaved(rank));
    ASSERT_EQ(g.machines(), 2);
    EXPECT_EQ(g.ranks_of_machine, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
    EXPECT_EQ(g.machine_index, rank % 2);
    EXPECT_EQ(g.machine.size(), 2);
    EXPECT_EQ(g.machine.rank(), rank / 2);
    EXPECT_EQ(static_cast<bool>(g.leaders), rank < 2);
    if (g.leaders) {
      EXPECT_EQ(g.leaders.rank(), rank);
    }
    EXPECT_EQ(g.place_of(3), std::make_pair(1, 1));
    EXPECT_EQ(sum_over(g.machine, rank), rank % 2 == 0 ? 2 : 4);

    // Forked ranks share this machine: one machine, which is the world itself, and no leaders.
    const auto here = group_by_machine(pg);
    EXPECT_EQ(here.machines(), 1);
    EXPECT_EQ(here.machine.size(), 4);
    EXPECT_FALSE(here.leaders);
    ::setenv("AMPP_MACHINE_ID", rank == 3 ? "elsewhere" : "here", 1);
    const auto split = group_by_machine(pg);
    EXPECT_EQ(split.ranks_of_machine, (std::vector<std::vector<int>>{{0, 1, 2}, {3}}));
    // Gloo's connectFullMesh ends with no barrier: a rank that destroyed its new groups at once (a
    // temporary, as this line was) closed them under a peer still connecting ("Connection closed by
    // peer", about 1 run in 25). Every rank keeps them until all are connected.
    pg.barrier();
    EXPECT_THROW(group_by_machine(pg, ""), c10::Error);  // local check: nobody waits
  });
}

TEST(HierarchicalAllreduce, EveryRankGetsTheMachineThenLeaderSumBitForBit) {
  on_ranks(4, [&](int rank, const ProcessGroup& pg) {
    const auto hook = hierarchical_allreduce_hook(group_by_machine(pg, interleaved(rank)));
    for (int call = 0; call < 6; ++call) {  // growing buckets regrow the segment
      const auto dtype = call % 2 == 0 ? torch::kFloat32 : torch::kBFloat16;
      const auto total = reduced_by(hook, bucket_values(rank, call, dtype));
      EXPECT_TRUE(torch::equal(total, two_machine_total(call, dtype))) << "call " << call << " " << dtype;
      EXPECT_TRUE(same_on_all_ranks(pg, total.view(torch::kByte)));  // the bits (as fp16 some would be NaN)
    }
  });
}

TEST(HierarchicalAllreduce, ThreeMachinesOfUnequalSizeAgreeWithTheExactMean) {
  on_ranks(4, [&](int rank, const ProcessGroup& pg) {
    const std::vector<std::string> ids{"a", "a", "b", "c"};  // 2 + 1 + 1 ranks
    const auto hook = hierarchical_allreduce_hook(group_by_machine(pg, ids[static_cast<size_t>(rank)]));
    const auto total = reduced_by(hook, bucket_values(rank, 1, torch::kFloat32));
    auto exact = torch::zeros({1037}, torch::kDouble);
    for (int r = 0; r < 4; ++r) exact += bucket_values(r, 1, torch::kFloat32).to(torch::kDouble) / 4;
    EXPECT_LT((total.to(torch::kDouble) - exact).abs().max().item<double>(), 1e-6);
    EXPECT_TRUE(same_on_all_ranks(pg, total));
  });
}

TEST(HierarchicalBufferBroadcast, EveryRankGetsTheSourcesTensorsFromAnyRankBitForBit) {
  on_ranks(4, [&](int rank, const ProcessGroup& pg) {
    const auto broadcast = hierarchical_buffer_broadcast(group_by_machine(pg, interleaved(rank)));
    auto values = [](int source, int call) {
      torch::manual_seed(10 * call + source);
      auto floats = torch::randn({21});
      floats[0] = std::numeric_limits<float>::quiet_NaN();
      return std::vector<torch::Tensor>{floats, torch::randint(1 << 30, {}, torch::kLong),
                                        torch::randn({3, 5}).to(torch::kBFloat16)};
    };
    for (int call = 0; call < 8; ++call) {
      const int source = (call * 3) % 4;  // leaders and the others, on both machines
      auto mine = values(rank, call);
      broadcast(mine, source);
      const auto expected = values(source, call);
      for (size_t i = 0; i < mine.size(); ++i)
        EXPECT_TRUE(torch::equal(mine[i].view({-1}).view(torch::kByte), expected[i].view({-1}).view(torch::kByte)))
            << "call " << call << " source " << source << " tensor " << i;
    }
  });
}

TEST(HierarchicalAllreduce, DdpThroughItTrainsLikeGlooOnTwoMachinesOfTwo) {
  on_ranks(4, [&](int rank, const ProcessGroup& pg) {
    auto batch = [&](int step) {
      auto g = global_batch(step, 4);
      return Data{g.x.narrow(0, rank * kBatch, kBatch), g.y.narrow(0, rank * kBatch, kBatch)};
    };
    torch::manual_seed(rank + 1);
    BnNet gloo_model;
    torch::manual_seed(rank + 1);
    BnNet tree_model;
    DistributedDataParallel gloo(gloo_model, pg), tree(tree_model, pg);
    const auto machines = group_by_machine(pg, interleaved(rank));
    tree.register_comm_hook(hierarchical_allreduce_hook(machines));
    tree.register_buffer_broadcast(hierarchical_buffer_broadcast(machines));
    torch::optim::SGD gloo_opt(gloo_model->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD tree_opt(tree_model->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 4; ++step) {
      const auto d = batch(step);
      for (auto* opt : {&gloo_opt, &tree_opt}) opt->zero_grad();
      torch::mse_loss(gloo->forward(d.x), d.y).backward();
      torch::mse_loss(tree->forward(d.x), d.y).backward();
      EXPECT_LT(rel_err(flat_grads(tree_model->parameters()), flat_grads(gloo_model->parameters())), 1e-5);
      EXPECT_TRUE(same_on_all_ranks(pg, flat_grads(tree_model->parameters())));
      gloo_opt.step();
      tree_opt.step();
    }
    EXPECT_LT(rel_err(flat_params(tree_model->parameters()), flat_params(gloo_model->parameters())), 1e-5);
    EXPECT_LT(rel_err(tree_model->bn->running_mean, gloo_model->bn->running_mean), 1e-5);
  });
}
