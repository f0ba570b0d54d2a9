// ampp::dist::ZeroRedundancyOptimizer: sharded training is bit-identical to unsharded DDP training
// (SGD with momentum and Adam, 2 and 3 ranks), each rank holds state for its shard only, GradScaler
// skips on every rank together, and checkpoints move between world sizes and plain optimizers.
#include "dist/ddp_test_util.h"

#include <ampp/amp/initialize.h>
#include <ampp/dist/join.h>
#include <ampp/dist/zero_redundancy_optimizer.h>
#include <ampp/scaling/fused_optimizers.h>

#include "ampp_test.h"
#include "host_reads.h"
#include "io/rewritten_archive.h"

#include <fstream>
#include <functional>
#include <iterator>

namespace ampp_test {
namespace {

using torch::optim::Adam;
using torch::optim::AdamOptions;
using torch::optim::SGD;
using torch::optim::SGDOptions;

Data world_batch(int step, int rank, int world) {
  auto g = global_batch(step, world);
  return {g.x.narrow(0, rank * kBatch, kBatch), g.y.narrow(0, rank * kBatch, kBatch)};
}

// One model trained with DDP and `optimizer`; the same steps on every kind of optimizer.
struct Trainee {
  Mlp model;
  DistributedDataParallel<Mlp> ddp;
  Trainee(int seed, const ProcessGroup& pg) : model(make_model(seed)), ddp(model, pg) {}
  void backward(int step, int rank, int world) {
    const auto d = world_batch(step, rank, world);
    torch::mse_loss(ddp.forward(d.x), d.y).backward();
  }
};

// One side's zero_grad and loss-scaled backward on `d`.
void scaled_backward(Trainee& side, torch::optim::Optimizer& opt, ampp::GradScaler& scaler, const Data& d) {
  opt.zero_grad();
  scaler.scale(torch::mse_loss(side.ddp.forward(d.x), d.y)).backward();
}

ZeroRedundancyOptimizer zero_adam(Trainee& t, const ProcessGroup& pg) {
  return ZeroRedundancyOptimizer::of<Adam>(t.ddp.parameters(), AdamOptions(1e-2),
                                           ZeroRedundancyOptimizerOptions().process_group(pg));
}

// Trains a ZeRO copy and an unsharded copy side by side; they must agree bit for bit at every step.
// `configure`, where given, is called on every rank with the ZeRO copy and the group before the first step.
template <typename OptimizerType, typename OptionsType>
void check_equal_to_unsharded(
    int world, const OptionsType& options,
    const std::function<void(ZeroRedundancyOptimizer&, const ProcessGroup&)>& configure = nullptr) {
  on_ranks(world, [&](int rank, const ProcessGroup& pg) {
    Trainee sharded(rank + 1, pg), plain(rank + 1, pg);
    auto zero = ZeroRedundancyOptimizer::of<OptimizerType>(sharded.ddp.parameters(), options,
                                                           ZeroRedundancyOptimizerOptions().process_group(pg));
    if (configure) configure(zero, pg);
    OptimizerType reference(plain.ddp.parameters(), options);
    for (int step = 0; step < 5; ++step) {
      zero.zero_grad();
      reference.zero_grad();
      sharded.backward(step, rank, world);
      plain.backward(step, rank, world);
      zero.step();
      reference.step();
      ASSERT_TRUE(torch::equal(flat_params(sharded.ddp.parameters()), flat_params(plain.ddp.parameters())))
          << "step " << step;
    }
    // State only for this rank's shard; the shards cover every parameter once.
    EXPECT_EQ(zero.local_optimizer().state().size(), zero.local_parameters().size());
    for (const auto& p : zero.local_parameters())
      EXPECT_EQ(zero.local_optimizer().state().count(ampp::optimizer_state_key(p)), 1u);
    auto held = torch::tensor({static_cast<int64_t>(zero.local_parameters().size())});
    std::vector<torch::Tensor> io{held};
    pg.c10d()->allreduce(io)->wait();
    EXPECT_EQ(held.item<int64_t>(), static_cast<int64_t>(sharded.ddp.parameters().size()));
    EXPECT_GT(zero.local_parameters().size(), 0u);
    EXPECT_LT(zero.local_parameters().size(), sharded.ddp.parameters().size());
  });
}

TEST(ZeroRedundancyOptimizer, SgdWithMomentumOnTwoRanksIsBitIdenticalToUnshardedDdp) {
  check_equal_to_unsharded<SGD>(2, SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
}

TEST(ZeroRedundancyOptimizer, AdamOnThreeRanksIsBitIdenticalToUnshardedDdp) {
  check_equal_to_unsharded<Adam>(3, AdamOptions(1e-2).weight_decay(1e-3));
}

// Adam on 2 ranks for 3 steps, consolidated; then 3 ranks continue from that file with ZeRO, and a
// plain Adam continues from the same file and from an unsharded run's own checkpoint: all three agree.
TEST(ZeroRedundancyOptimizer, AConsolidatedCheckpointOfTwoRanksResumesOnThreeAndInAPlainOptimizer) {
  TempDir dir;
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    Trainee sharded(rank + 1, pg), plain(rank + 1, pg);
    auto zero = zero_adam(sharded, pg);
    Adam reference(plain.ddp.parameters(), AdamOptions(1e-2));
    for (int step = 0; step < 3; ++step) {
      zero.zero_grad();
      reference.zero_grad();
      sharded.backward(step, rank, 2);
      plain.backward(step, rank, 2);
      zero.step();
      reference.step();
    }
    zero.save_consolidated(dir.file("zero.pt"));
    if (rank == 0) {
      torch::save(sharded.model, dir.file("model.pt"));
      torch::save(reference, dir.file("plain.pt"));
    }
    EXPECT_EQ(error_of([&] { zero.save_shard(dir.file("shard" + std::to_string(rank))); }), "<no error>");
  });
  on_ranks(3, [&](int rank, const ProcessGroup& pg) {
    std::vector<std::unique_ptr<Trainee>> runs;
    for (int i = 0; i < 3; ++i) {
      runs.push_back(std::make_unique<Trainee>(rank + 1, pg));
      torch::load(runs.back()->model, dir.file("model.pt"));
    }
    auto zero = zero_adam(*runs[0], pg);
    // The same options as saved: LibTorch 2.x restores a group's options from the file, 1.13 keeps its own.
    Adam from_zero_file(runs[1]->ddp.parameters(), AdamOptions(1e-2));
    Adam from_plain_file(runs[2]->ddp.parameters(), AdamOptions(1e-2));
    torch::load(zero, dir.file("zero.pt"));
    torch::load(from_zero_file, dir.file("zero.pt"));
    torch::load(from_plain_file, dir.file("plain.pt"));
    EXPECT_EQ(zero.local_optimizer().state().size(), zero.local_parameters().size());
    EXPECT_EQ(static_cast<AdamOptions&>(zero.local_optimizer().param_groups()[0].options()).lr(), 1e-2);
    std::vector<torch::optim::Optimizer*> optimizers{&zero, &from_zero_file, &from_plain_file};
    for (int step = 3; step < 6; ++step) {
      for (int i = 0; i < 3; ++i) {
        optimizers[i]->zero_grad();
        runs[i]->backward(step, rank, 3);
        optimizers[i]->step();
      }
      const auto expected = flat_params(runs[2]->ddp.parameters());
      ASSERT_TRUE(torch::equal(flat_params(runs[0]->ddp.parameters()), expected)) << "ZeRO, step " << step;
      ASSERT_TRUE(torch::equal(flat_params(runs[1]->ddp.parameters()), expected)) << "plain from ZeRO, step " << step;
    }
    // A shard of the 2-rank run does not fit a 3-rank group, and says what to do instead.
    AMPP_EXPECT_THROW_WITH(zero.load_shard(dir.file("shard" + std::to_string(std::min(rank, 1)))),
                           "Shards only fit the same world size and rank; to change the world size, save with "
                           "save_consolidated()");
  });
}

// Shards saved after 2 steps and loaded by a fresh run of the same world size continue exactly as the
// run that was not interrupted.
TEST(ZeroRedundancyOptimizer, ShardsResumeOnTheSameWorldSizeExactly) {
  TempDir dir;
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    Trainee run(rank + 1, pg);
    auto zero = zero_adam(run, pg);
    for (int step = 0; step < 4; ++step) {
      if (step == 2) {
        zero.save_shard(dir.file("shard" + std::to_string(rank)));
        if (rank == 0) torch::save(run.model, dir.file("model.pt"));
      }
      zero.zero_grad();
      run.backward(step, rank, 2);
      zero.step();
    }
    if (rank == 0) torch::save(flat_params(run.ddp.parameters()), dir.file("final.pt"));
  });
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    Trainee run(rank + 1, pg);
    torch::load(run.model, dir.file("model.pt"));
    auto zero = zero_adam(run, pg);
    zero.load_shard(dir.file("shard" + std::to_string(rank)));
    for (int step = 2; step < 4; ++step) {
      zero.zero_grad();
      run.backward(step, rank, 2);
      zero.step();
    }
    torch::Tensor uninterrupted;
    torch::load(uninterrupted, dir.file("final.pt"));
    EXPECT_TRUE(torch::equal(flat_params(run.ddp.parameters()), uninterrupted));
    // Another rank's shard is refused.
    AMPP_EXPECT_THROW_WITH(zero.load_shard(dir.file("shard" + std::to_string(1 - rank))),
                           "Shards only fit the same world size and rank");
  });
}

// A shard is read from untrusted bytes by ampp's hardened reader (issue 52, defect 14), never by
// torch::jit::load: its TorchScript is not compiled, so code LibTorch's loader would reject still loads.
TEST(ZeroRedundancyOptimizer, AShardIsReadByTheHardenedReader) {
  TempDir dir;
  on_ranks(1, [&](int, const ProcessGroup& pg) {
    Trainee run(1, pg);
    auto zero = zero_adam(run, pg);
    zero.zero_grad();
    run.backward(0, 0, 1);
    zero.step();
    zero.save_shard(dir.file("shard"));
    std::ifstream in(dir.file("shard"), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string edited = rewritten(bytes, [](const std::string& name, std::string content) {
      if (name.rfind("code/", 0) == 0 && name.size() > 3 && name.substr(name.size() - 3) == ".py")
        content += "  def forward(self) -> Tensor:\n    return undefined_name(\n";
      return content;
    });
    std::ofstream(dir.file("edited"), std::ios::binary) << edited;
    torch::serialize::InputArchive libtorch;
    EXPECT_FALSE(error_of([&] { libtorch.load_from(dir.file("edited")); }).empty());
    zero.load_shard(dir.file("edited"));
    EXPECT_EQ(zero.local_optimizer().state().size(), zero.local_parameters().size());
  });
}

// An overflow on one rank reaches every rank through DDP's averaged gradients: all skip together, and
// with unscale_ + gradient clipping the run matches unsharded training.
TEST(ZeroRedundancyOptimizer, GradScalerSkipsOnEveryRankTogetherAndClippingMatchesUnsharded) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    Trainee sharded(rank + 1, pg), plain(rank + 1, pg);
    auto zero = ZeroRedundancyOptimizer::of<SGD>(sharded.ddp.parameters(), SGDOptions(0.1).momentum(0.9),
                                                 ZeroRedundancyOptimizerOptions().process_group(pg));
    SGD reference(plain.ddp.parameters(), SGDOptions(0.1).momentum(0.9));
    ampp::GradScaler zero_scaler, plain_scaler;
    for (int step = 0; step < 4; ++step) {
      auto d = world_batch(step, rank, 2);
      if (step == 1 && rank == 1) d.x[0][0] = std::numeric_limits<float>::infinity();
      const auto before = flat_params(sharded.ddp.parameters());
      std::vector<bool> stepped;
      for (auto* side : {&sharded, &plain}) {
        const bool is_zero = side == &sharded;
        torch::optim::Optimizer& opt = is_zero ? static_cast<torch::optim::Optimizer&>(zero) : reference;
        auto& scaler = is_zero ? zero_scaler : plain_scaler;
        scaled_backward(*side, opt, scaler, d);
        scaler.unscale_(opt);
        torch::nn::utils::clip_grad_norm_(side->ddp.parameters(), 0.5);
        stepped.push_back(scaler.step(opt));
        scaler.update();
      }
      // ZeRO takes GradScaler's fused path (GradScaleAwareOptimizer): "handed to the optimizer", which skips.
      EXPECT_TRUE(stepped[0]) << "step " << step;
      EXPECT_EQ(zero_scaler.found_inf_last_step(), step == 1) << "step " << step;
      EXPECT_EQ(stepped[1], step != 1) << "step " << step;
      if (step == 1) EXPECT_TRUE(torch::equal(flat_params(sharded.ddp.parameters()), before));
      EXPECT_TRUE(torch::equal(flat_params(sharded.ddp.parameters()), flat_params(plain.ddp.parameters())))
          << "step " << step;
    }
    EXPECT_TRUE(same_on_all_ranks(pg, flat_params(sharded.ddp.parameters())));
  });
}

// With a fused local optimizer ZeRO hands it the scaler's scale and skip flag: a scaled step, skipped or
// not, reads nothing on the host (issue 52, defect 8), and the run is unsharded FusedSGD's bit for bit.
TEST(ZeroRedundancyOptimizer, AFusedLocalOptimizerSkipsOnTheDeviceWithNoHostReadAsUnshardedFusedSgd) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    Trainee sharded(rank + 1, pg), plain(rank + 1, pg);
    const auto options = SGDOptions(0.1).momentum(0.9);
    ZeroRedundancyOptimizer zero(
        {torch::optim::OptimizerParamGroup(sharded.ddp.parameters())},
        [options](const std::vector<torch::optim::OptimizerParamGroup>& groups) {
          return std::make_unique<ampp::FusedSGD>(groups, options);
        },
        ZeroRedundancyOptimizerOptions().process_group(pg));
    ampp::FusedSGD reference(plain.ddp.parameters(), options);
    ampp::GradScaler zero_scaler, plain_scaler;
    int reads = 0;
    for (int step = 0; step < 5; ++step) {
      auto d = world_batch(step, rank, 2);
      if (step == 2 && rank == 1) d.x[0][0] = std::numeric_limits<float>::infinity();
      for (auto* side : {&sharded, &plain}) {
        const bool is_zero = side == &sharded;
        torch::optim::Optimizer& opt = is_zero ? static_cast<torch::optim::Optimizer&>(zero) : reference;
        auto& scaler = is_zero ? zero_scaler : plain_scaler;
        scaled_backward(*side, opt, scaler, d);
        HostReadCounter counter;
        scaler.step(opt);
        scaler.update();
        if (is_zero && step > 0) reads += counter.count();  // step 0: DDP's first iteration sets its buckets
      }
      EXPECT_TRUE(torch::equal(flat_params(sharded.ddp.parameters()), flat_params(plain.ddp.parameters())))
          << "step " << step;
    }
    EXPECT_EQ(reads, 0) << "host reads in ZeRO's scaled steps";
    EXPECT_EQ(zero_scaler.skipped_steps(), 1);
    EXPECT_TRUE(same_on_all_ranks(pg, flat_params(sharded.ddp.parameters())));
  });
}

// apex O2 (bf16 model, FP32 masters): each rank keeps masters and Adam state for its shard only, and
// the bf16 model it trains equals unsharded O2 training bit for bit.
TEST(ZeroRedundancyOptimizer, UnderO2EachRankKeepsMastersOfItsShardOnlyAndMatchesUnshardedO2) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    // One seed on every rank: the masters are taken from the model at initialize(), before DDP's broadcast.
    auto sharded = make_model(1), plain = make_model(1);
    auto zero = ZeroRedundancyOptimizer::of<Adam>(sharded->parameters(), AdamOptions(1e-2),
                                                  ZeroRedundancyOptimizerOptions().process_group(pg));
    Adam reference(plain->parameters(), AdamOptions(1e-2));
    const auto o2 = ampp::Properties("O2").verbosity(0);
    auto amp_sharded = ampp::initialize(sharded, zero, o2), amp_plain = ampp::initialize(plain, reference, o2);
    DistributedDataParallel<Mlp> ddp_sharded(sharded, pg), ddp_plain(plain, pg);
    for (int step = 0; step < 4; ++step) {
      const auto d = world_batch(step, rank, 2);
      amp_sharded.zero_grad();
      amp_sharded.scale_loss(torch::mse_loss(amp_sharded.forward(ddp_sharded, d.x), d.y)).backward();
      amp_sharded.step();
      amp_plain.zero_grad();
      amp_plain.scale_loss(torch::mse_loss(amp_plain.forward(ddp_plain, d.x), d.y)).backward();
      amp_plain.step();
      ASSERT_TRUE(torch::equal(flat_params(sharded->parameters()), flat_params(plain->parameters()))) << step;
    }
    EXPECT_EQ(sharded->parameters()[0].scalar_type(), torch::kBFloat16);
    for (const auto& p : zero.local_parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
    EXPECT_EQ(amp_sharded.state_dict().at("master_params").toTensorVector().size(), zero.local_parameters().size());
    EXPECT_EQ(amp_plain.state_dict().at("master_params").toTensorVector().size(), plain->parameters().size());
    EXPECT_LT(zero.local_parameters().size(), plain->parameters().size());
  });
}

// One process's view of a join run (SGD without momentum, so a frozen parameter is all a sitting-out
// rank's shard keeps): the mean of the active ranks' gradients over the whole world, and, if
// `freeze`, the shard of a rank that ran out restored after each step (its owner no longer steps it).
torch::Tensor join_reference(const std::vector<int>& batches, bool freeze) {
  auto model = make_model(1);
  SGD opt(model->parameters(), 0.1);
  const auto owners = assign_parameters_to_ranks({torch::optim::OptimizerParamGroup(model->parameters())}, 2);
  for (int step = 0; step < std::max(batches[0], batches[1]); ++step) {
    opt.zero_grad();
    for (int r = 0; r < 2; ++r) {
      if (step >= batches[static_cast<size_t>(r)]) continue;
      const auto b = world_batch(step, r, 2);
      (torch::mse_loss(model->forward(b.x), b.y) / 2).backward();
    }
    const auto before = snapshot(model->parameters());
    opt.step();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < before.size(); ++i) {
      if (freeze && step >= batches[static_cast<size_t>(owners[i])]) model->parameters()[i].copy_(before[i]);
    }
  }
  return flat_params(model->parameters());
}

// Ranks with 3 and 5 batches both finish; while rank 0 sits out, its shard stays as it was (PyTorch's
// ZeRO join hook) and the rest takes rank 1's gradients.
TEST(ZeroRedundancyOptimizer, JoinLetsRanksWithThreeAndFiveBatchesFinishWithTheJoinedShardFrozen) {
  const std::vector<int> batches{3, 5};
  const auto frozen = join_reference(batches, true), unfrozen = join_reference(batches, false);
  ASSERT_GT(rel_err(unfrozen, frozen), 1e-3);  // the reference tells the two semantics apart
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_model(rank + 1);
    DistributedDataParallel<Mlp> ddp(model, pg);
    auto zero = ZeroRedundancyOptimizer::of<SGD>(ddp.parameters(), SGDOptions(0.1),
                                                 ZeroRedundancyOptimizerOptions().process_group(pg));
    ampp::dist::join({&ddp.joinable(), &zero}, [&] {
      for (int step = 0; step < batches[static_cast<size_t>(rank)]; ++step) {
        zero.zero_grad();
        const auto b = world_batch(step, rank, 2);
        torch::mse_loss(ddp.forward(b.x), b.y).backward();
        zero.step();
      }
    });
    EXPECT_TRUE(same_on_all_ranks(pg, flat_params(ddp.parameters())));
    EXPECT_LT(rel_err(flat_params(ddp.parameters()), frozen), 1e-5);
  });
}

// The step's broadcasts through another group of the same ranks (`ampp train` hands ZeRO DDP's NCCL group
// where each worker has its GPU): the same training, bit for bit, as unsharded SGD. A group of other ranks
// is refused, on every rank.
TEST(ZeroRedundancyOptimizer, ItsBroadcastsGoThroughAnotherGroupOfTheSameRanksAlike) {
  check_equal_to_unsharded<SGD>(
      3, SGDOptions(0.1).momentum(0.9), [](ZeroRedundancyOptimizer& zero, const ProcessGroup& pg) {
        const auto same = new_group(pg, {0, 1, 2});
        const auto pair = new_group(pg, {0, 1});  // rank 2 is not in it
        AMPP_EXPECT_THROW_WITH(zero.set_broadcast_group(pair), "must hold the optimizer's ranks in the same order");
        zero.set_broadcast_group(same);
      });
}

TEST(ZeroRedundancyOptimizer, MisuseIsAClearError) {
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    Trainee run(rank + 1, pg);
    auto zero = zero_adam(run, pg);
    AMPP_EXPECT_THROW_WITH(zero.step([] { return torch::zeros({}); }), "a closure is not supported");
    torch::serialize::OutputArchive archive;
    AMPP_EXPECT_THROW_WITH(zero.save(archive), "Call consolidate_state_dict(to) on every rank first");
    AMPP_EXPECT_THROW_WITH(zero.consolidate_state_dict(2), "rank 2 is not in the group (ranks 0..1)");
    AMPP_EXPECT_THROW_WITH(ZeroRedundancyOptimizer({torch::optim::OptimizerParamGroup(run.ddp.parameters())}, nullptr,
                                                   ZeroRedundancyOptimizerOptions().process_group(pg)),
                           "the optimizer factory is empty");
    pg.barrier();
  });
}

}  // namespace
}  // namespace ampp_test
