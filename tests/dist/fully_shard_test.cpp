// ampp::dist::FullyShardedDataParallel on 2 and 3 Gloo ranks: training equal bit for bit to DDP's in
// FP32 (with units entered through unit_forward or not, resharded after forward or not), memory held
// between steps, mixed-precision policies, clipping, GradScaler agreement, and checkpoints.
#include "dist/ddp_test_util.h"
#include "dist/fsdp_test_util.h"

#include <ampp/dist/fully_shard.h>
#include <ampp/io/pytorch_checkpoint.h>
#include <ampp/precision/autocast.h>
#include <ampp/scaling/grad_scaler.h>
#include <ampp/util/torch_version.h>

#include "ampp_test.h"

namespace ampp_test {
namespace {

using torch::optim::Adam;
using torch::optim::AdamOptions;

Data stack_batch(int step, int rank, int world) {
  auto gen = at::detail::createCPUGenerator(500 + step);
  auto x = torch::randn({world * 4, 8}, gen, torch::kFloat), y = torch::randn({world * 4, 5}, gen, torch::kFloat);
  return {x.narrow(0, rank * 4, 4), y.narrow(0, rank * 4, 4)};
}

// Trains DDP and FSDP copies of the same model on the same batches. With 2 ranks the parameters must stay
// bitwise equal: DDP sums g/2 over the ranks and FSDP divides the sum by 2, and halving is exact. With 3,
// g/3 summed and the sum divided by 3 round differently, so only closeness is asked there.
void check_equal_to_ddp(int world, bool through_units, FullyShardOptions options) {
  const bool exact = world == 2;
  on_ranks(world, [&](int rank, const ProcessGroup& pg) {
    auto plain = make_stack(rank + 1, through_units);  // rank 0's weights reach every rank in both
    DistributedDataParallel<Stack> ddp(plain, pg);
    Adam plain_opt(ddp.parameters(), AdamOptions(1e-2));
    auto sharded = make_stack(rank + 1, through_units);
    FullyShardedDataParallel fsdp(sharded, sharded->units(), options.process_group(pg));
    Adam sharded_opt(fsdp.parameters(), AdamOptions(1e-2));
    for (int step = 0; step < 6; ++step) {
      const auto d = stack_batch(step, rank, world);
      plain_opt.zero_grad();
      sharded_opt.zero_grad();
      auto plain_loss = torch::mse_loss(ddp.forward(d.x), d.y);
      auto sharded_loss = torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y);
      if (exact) ASSERT_TRUE(torch::equal(plain_loss, sharded_loss)) << "step " << step;
      plain_loss.backward();
      sharded_loss.backward();
      plain_opt.step();
      sharded_opt.step();
    }
    const auto expected = flat_params(plain->parameters()), actual = flat_state(fsdp.full_state_dict(), *plain);
    if (exact)
      EXPECT_TRUE(torch::equal(expected, actual));
    else
      EXPECT_LT(rel_err(actual, expected), 1e-5);
  });
}

TEST(FullyShard, TwoRanksTrainBitForBitAsDdp) { check_equal_to_ddp(2, true, FullyShardOptions()); }

TEST(FullyShard, ThreeRanksTrainAsDdpUpToTheDivisionByThree) { check_equal_to_ddp(3, true, FullyShardOptions()); }

TEST(FullyShard, KeepingUnitsGatheredFromForwardToBackwardTrainsTheSame) {
  check_equal_to_ddp(2, true, FullyShardOptions().reshard_after_forward(false));
}

TEST(FullyShard, ThroughTheBackendInsteadOfSharedMemoryTrainsTheSame) {
  check_equal_to_ddp(2, true, FullyShardOptions().shared_memory(false));
}

// FSDP2's prefetching through the backend: from the second step on, each unit's all-gather is issued while
// the one before it computes (forward) or after it (backward); training stays DDP's, bit for bit.
TEST(FullyShard, PrefetchingTheNextUnitsGatherTrainsTheSame) {
  check_equal_to_ddp(2, true, FullyShardOptions().shared_memory(false).prefetch(true));
  on_ranks(2, [](int rank, const ProcessGroup& pg) {
    for (const bool prefetch : {true, false}) {
      auto model = make_stack(1);
      FullyShardedDataParallel fsdp(model, model->units(),
                                    FullyShardOptions().process_group(pg).shared_memory(false).prefetch(prefetch));
      for (int step = 0; step < 3; ++step) {
        const auto d = stack_batch(step, rank, 2);
        torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
      }
      // Steps 2 and 3 each prefetch the 3 blocks in forward and the 2 before the last in backward.
      EXPECT_EQ(fsdp.prefetched_gathers(), prefetch ? 2 * (3 + 2) : 0);
    }
  });
}

TEST(FullyShard, AModelThatNeverEntersItsUnitsTrainsTheSame) { check_equal_to_ddp(2, false, FullyShardOptions()); }

TEST(FullyShard, EachRankHoldsItsRowsAndTheModuleHoldsNoMemoryBetweenSteps) {
  on_ranks(2, [](int rank, const ProcessGroup& pg) {
    auto model = make_stack(1);
    int64_t full = 0;
    for (const auto& p : model->parameters()) full += p.numel();
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    int64_t held = 0;
    for (const auto& p : fsdp.parameters()) held += p.numel();
    // up.weight has 13 rows: rank 0 holds 7, rank 1 the other 6.
    for (const auto& [name, shard] : fsdp.named_parameters())
      if (name == "block0.up.weight") EXPECT_EQ(shard.size(0), rank == 0 ? 7 : 6);
    EXPECT_LE(held, full / 2 + 64);
    EXPECT_GE(held, full / 2 - 64);
    auto d = stack_batch(0, rank, 2);
    torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.storage().nbytes(), 0u) << "a module parameter kept its memory after backward";
      EXPECT_FALSE(p.grad().defined()) << "a full gradient was kept after backward";
    }
    for (const auto& p : fsdp.parameters()) EXPECT_TRUE(p.grad().defined());
    // The three blocks were entered through unit_forward: 3 units and the root.
    EXPECT_EQ(fsdp.unit_parameter_names().size(), 4u);
    EXPECT_EQ(fsdp.unit_parameter_names()[1].size(), 6u);
  });
}

TEST(FullyShard, BFloat16PolicyKeepsNormsFp32AndTrainsCloseToFp32) {
#if !AMPP_TORCH_AT_LEAST(2, 0)
  GTEST_SKIP() << "LibTorch 1.x's CPU layer_norm takes its input and weight in one dtype (bf16 meets FP32 here)";
#endif
  on_ranks(2, [](int rank, const ProcessGroup& pg) {
    auto fp32 = make_stack(1), bf16 = make_stack(1);
    FullyShardedDataParallel ref(fp32, fp32->units(), FullyShardOptions().process_group(pg));
    // The head stays FP32 by name; autocast reconciles the dtypes that meet in one op.
    auto policy = MixedPrecisionPolicy()
                      .param_dtype(torch::kBFloat16)
                      .keep_norms_fp32(true)
                      .output_dtype(torch::kFloat)
                      .param_dtypes({{"head.weight", torch::kFloat}, {"head.bias", torch::kFloat}});
    FullyShardedDataParallel low(bf16, bf16->units(), FullyShardOptions().process_group(pg).mp_policy(policy));
    const auto dtypes = low.gathered_dtypes();
    EXPECT_EQ(dtypes.at("block0.norm.weight"), torch::kFloat);
    EXPECT_EQ(dtypes.at("block0.up.weight"), torch::kBFloat16);
    EXPECT_EQ(dtypes.at("head.bias"), torch::kFloat);
    for (const auto& p : low.parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat) << "shards are FP32 masters";
    Adam ref_opt(ref.parameters(), AdamOptions(1e-3)), low_opt(low.parameters(), AdamOptions(1e-3));
    for (int step = 0; step < 4; ++step) {
      const auto d = stack_batch(step, rank, 2);
      ref_opt.zero_grad();
      low_opt.zero_grad();
      torch::mse_loss(ref.forward<StackImpl>(d.x), d.y).backward();
      torch::Tensor out;
      {
        ampp::autocast bf16(torch::kCPU, torch::kBFloat16);
        out = low.forward<StackImpl>(d.x);
      }
      EXPECT_EQ(out.scalar_type(), torch::kFloat) << "output_dtype";
      torch::mse_loss(out, d.y).backward();
      ref_opt.step();
      low_opt.step();
    }
    const auto a = flat_state(ref.full_state_dict(), *fp32), b = flat_state(low.full_state_dict(), *fp32);
    EXPECT_FALSE(torch::equal(a, b)) << "bf16 compute must differ from FP32 somewhere";
    EXPECT_LT(rel_err(b, a), 2e-2);
  });
}

TEST(FullyShard, ClipGradNormIsTheWholeModelsNorm) {
  on_ranks(2, [](int rank, const ProcessGroup& pg) {
    auto plain = make_stack(1), sharded = make_stack(1);
    DistributedDataParallel<Stack> ddp(plain, pg);
    FullyShardedDataParallel fsdp(sharded, sharded->units(), FullyShardOptions().process_group(pg));
    const auto d = stack_batch(0, rank, 2);
    torch::mse_loss(ddp.forward(d.x), d.y).backward();
    torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
    const double expected = torch::nn::utils::clip_grad_norm_(plain->parameters(), 0.05);
    const double total = fsdp.clip_grad_norm_(0.05).item<double>();
    EXPECT_NEAR(total, expected, 1e-6 * expected);
    double clipped = 0;
    for (const auto& p : fsdp.parameters()) clipped += p.grad().pow(2).sum().item<double>();
    std::vector<torch::Tensor> io{torch::tensor({clipped}, torch::kDouble)};
    pg.c10d()->allreduce(io)->wait();
    EXPECT_NEAR(std::sqrt(io[0].item<double>()), 0.05, 1e-4);
  });
}

// The full state dict is a copy: at one rank the gathered tensor would otherwise be the live shard, and a
// dict kept (or being written) would change with the next step.
TEST(FullyShard, TheFullStateDictIsASnapshotThatLaterStepsLeaveAlone) {
  for (const int world : {1, 2}) {
    on_ranks(world, [&](int rank, const ProcessGroup& pg) {
      auto model = make_stack(1);
      FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
      torch::optim::SGD opt(fsdp.parameters(), torch::optim::SGDOptions(0.1));
      const auto dict = fsdp.full_state_dict();
      const auto before = flat_state(dict, *model).clone();
      const auto d = stack_batch(0, rank, world);
      torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
      opt.step();
      EXPECT_FALSE(torch::equal(before, flat_state(fsdp.full_state_dict(), *model))) << "the step changed nothing";
      EXPECT_TRUE(torch::equal(before, flat_state(dict, *model))) << "world " << world;
    });
  }
}

TEST(FullyShard, GradScalerSkipsOnEveryRankWhenOneShardOverflows) {
  on_ranks(2, [](int rank, const ProcessGroup& pg) {
    auto model = make_stack(1);
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    torch::optim::SGD opt(fsdp.parameters(), torch::optim::SGDOptions(0.1));
    ampp::GradScaler scaler;
    scaler.set_found_inf_hook(fsdp.found_inf_hook());
    const auto before = flat_state(fsdp.full_state_dict(), *model);
    const auto d = stack_batch(0, rank, 2);
    scaler.scale(torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y)).backward();
    // Only rank 0's shard of in.weight overflows: rank 1 sees finite gradients.
    if (rank == 0) fsdp.parameters()[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    scaler.step(opt);
    scaler.update();
    EXPECT_TRUE(torch::equal(before, flat_state(fsdp.full_state_dict(), *model))) << "a rank stepped";
    EXPECT_EQ(scaler.get_scale(), 65536.0 * 0.5);
  });
}

TEST(FullyShard, FullCheckpointsMoveBetweenWorldSizesAndPlainModules) {
  TempDir dir;
  const std::string path = dir.file("full.pt");
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_stack(1);
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    Adam opt(fsdp.parameters(), AdamOptions(1e-2));
    const auto d = stack_batch(0, rank, 2);
    torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
    opt.step();
    fsdp.save_full(path);
    fsdp.save_sharded(dir.file("shard" + std::to_string(rank) + ".pt"), &opt);
    // One step more: what a run resumed from the shards must reproduce.
    opt.zero_grad();
    torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
    opt.step();
    const auto next = flat_state(fsdp.full_state_dict(), *model);  // collective
    if (rank == 0) torch::save(next, dir.file("next.pt"));         // the ranks are forked: a file carries it over
  });
  // A plain module reads it as PyTorch's load_state_dict would.
  auto plain = make_stack(7);
  ampp::load_module_state_dict(*plain, ampp::load_pytorch(path));
  const auto expected = flat_params(plain->parameters());
  EXPECT_FALSE(torch::equal(expected, flat_params(make_stack(1)->parameters()))) << "the step changed nothing";
  on_ranks(3, [&](int, const ProcessGroup& pg) {
    auto model = make_stack(5);
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    fsdp.load_full(path);
    EXPECT_TRUE(torch::equal(flat_state(fsdp.full_state_dict(), *model), expected));
    AMPP_EXPECT_THROW_WITH(fsdp.load_sharded(dir.file("shard0.pt")), "save with save_full()");
  });
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_stack(5);
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    Adam opt(fsdp.parameters(), AdamOptions(1e-2));
    fsdp.load_sharded(dir.file("shard" + std::to_string(rank) + ".pt"), &opt);
    EXPECT_TRUE(torch::equal(flat_state(fsdp.full_state_dict(), *model), expected));
    const auto d = stack_batch(0, rank, 2);
    opt.zero_grad();
    torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
    opt.step();  // Adam's moments and step count came back: the same step as the run that saved them
    const auto next = flat_state(fsdp.full_state_dict(), *model);
    torch::Tensor expected_next;
    torch::load(expected_next, dir.file("next.pt"));
    EXPECT_TRUE(torch::equal(next, expected_next));
  });
}

// Every state tensor of one optimizer state dict equal, bit for bit, to the other's (and "step" alike).
void expect_same_optimizer_state(const c10::IValue& actual, const c10::IValue& expected) {
  const auto a = actual.toGenericDict().at("state").toGenericDict();
  const auto e = expected.toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(a.size(), e.size());
  for (const auto& item : e) {
    const auto mine = a.at(item.key()).toGenericDict(), theirs = item.value().toGenericDict();
    ASSERT_EQ(mine.size(), theirs.size()) << "parameter " << item.key().toInt();
    for (const auto& entry : theirs)
      EXPECT_TRUE(torch::equal(mine.at(entry.key()).toTensor(), entry.value().toTensor()))
          << "parameter " << item.key().toInt() << ", " << entry.key().toStringRef();
  }
}

// FSDP2's full optimizer state dict: the sharded Adam's state gathered whole is DDP's optimizer's, bit for
// bit (2 ranks train alike); ranks that load it take their rows and step as the saving run would have; and
// any world size gives the same whole back.
TEST(FullyShard, TheFullOptimizerStateIsDdpsAndResumesOnAnyWorldSize) {
  TempDir dir;
  const auto adam = AdamOptions(1e-2).amsgrad(true);  // all three of Adam's moments
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto plain = make_stack(1);
    DistributedDataParallel<Stack> ddp(plain, pg);
    Adam plain_opt(ddp.parameters(), adam);
    auto model = make_stack(1);
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    Adam opt(fsdp.parameters(), adam);
    for (int step = 0; step < 4; ++step) {
      const auto d = stack_batch(step, rank, 2);
      if (step == 3) {  // the state to resume from; then the step a resumed run must equal
        fsdp.save_full(dir.file("model.pt"));
        const auto full = fsdp.full_optimizer_state_dict(opt);  // collective
        expect_same_optimizer_state(full, ampp::optimizer_state_dict(plain_opt));
        if (rank == 0) ampp::save_pytorch(full, dir.file("adam.pt"));
      }
      plain_opt.zero_grad(), opt.zero_grad();
      torch::mse_loss(ddp.forward(d.x), d.y).backward();
      torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
      plain_opt.step(), opt.step();
    }
    const auto next = flat_state(fsdp.full_state_dict(), *model);
    if (rank == 0) torch::save(next, dir.file("next.pt"));
  });
  const auto saved = ampp::load_pytorch(dir.file("adam.pt")).toGenericDict();
  on_ranks(2, [&](int rank, const ProcessGroup& pg) {
    auto model = make_stack(5);
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    Adam opt(fsdp.parameters(), AdamOptions(0.5));  // the file's hyperparameters replace these, as in PyTorch
    fsdp.load_full(dir.file("model.pt"));
    fsdp.load_full_optimizer_state_dict(opt, saved);
    const auto d = stack_batch(3, rank, 2);
    torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
    opt.step();
    torch::Tensor expected_next;
    torch::load(expected_next, dir.file("next.pt"));
    EXPECT_TRUE(torch::equal(flat_state(fsdp.full_state_dict(), *model), expected_next));
  });
  on_ranks(3, [&](int, const ProcessGroup& pg) {
    auto model = make_stack(5);
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    Adam opt(fsdp.parameters(), adam);
    fsdp.load_full_optimizer_state_dict(opt, saved);
    expect_same_optimizer_state(fsdp.full_optimizer_state_dict(opt), saved);
    auto other = make_stack(6, /*units=*/true);
    Adam foreign(other->parameters(), adam);
    AMPP_EXPECT_THROW_WITH(fsdp.load_full_optimizer_state_dict(foreign, saved), "build it over fsdp.parameters()");
  });
}

TEST(FullyShard, AStateDictOfAnotherModelIsOneErrorListingEveryMismatch) {
  on_ranks(1, [](int, const ProcessGroup& pg) {
    auto model = make_stack(1);
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    auto state = fsdp.full_state_dict();
    ASSERT_EQ(state.erase("head.bias"), 1u);
    state.insert_or_assign("in.weight", torch::zeros({3, 3}));
    state.insert("extra", torch::zeros({1}));
    const auto message = error_of([&] { fsdp.load_full_state_dict(state); });
    EXPECT_THAT(message, ::testing::HasSubstr("missing: head.bias"));
    EXPECT_THAT(message, ::testing::HasSubstr("in.weight has shape [3, 3]"));
    EXPECT_THAT(message, ::testing::HasSubstr("unexpected: extra"));
  });
}

TEST(FullyShard, AFrozenParameterStaysAsItIsAndTheRestTrainsAsDdp) {
  on_ranks(2, [](int rank, const ProcessGroup& pg) {
    auto plain = make_stack(1), sharded = make_stack(1);
    for (auto* m : {&plain, &sharded}) (*m)->blocks[1]->up->weight.set_requires_grad(false);
    const auto frozen = sharded->blocks[1]->up->weight.detach().clone();
    DistributedDataParallel<Stack> ddp(plain, pg);
    FullyShardedDataParallel fsdp(sharded, sharded->units(), FullyShardOptions().process_group(pg));
    std::vector<torch::Tensor> trainable;
    for (const auto& p : ddp.parameters())
      if (p.requires_grad()) trainable.push_back(p);
    Adam plain_opt(trainable, AdamOptions(1e-2)), sharded_opt(fsdp.parameters(), AdamOptions(1e-2));
    for (int step = 0; step < 3; ++step) {
      const auto d = stack_batch(step, rank, 2);
      plain_opt.zero_grad();
      sharded_opt.zero_grad();
      torch::mse_loss(ddp.forward(d.x), d.y).backward();
      torch::mse_loss(fsdp.forward<StackImpl>(d.x), d.y).backward();
      plain_opt.step();
      sharded_opt.step();
    }
    const auto state = fsdp.full_state_dict();
    EXPECT_TRUE(torch::equal(state.at("block1.up.weight").toTensor(), frozen));
    EXPECT_TRUE(torch::equal(flat_params(plain->parameters()), flat_state(state, *plain)));
  });
}

TEST(FullyShard, ForwardInputsAreCastOnlyUnderAParamDtypeAsInFsdp2) {
  on_ranks(1, [](int, const ProcessGroup& pg) {
    auto plain = make_stack(1), low = make_stack(1);
    FullyShardedDataParallel no_policy(plain, plain->units(), FullyShardOptions().process_group(pg));
    FullyShardedDataParallel bf16(
        low, low->units(),
        FullyShardOptions().process_group(pg).mp_policy(MixedPrecisionPolicy().param_dtype(torch::kBFloat16)));
    const auto x = torch::ones({2, 12}, torch::kBFloat16);
    EXPECT_EQ(
        ampp::dist::detail::fsdp_cast_input(*ampp::dist::detail::fsdp_unit_of(*plain->blocks[0]), x).scalar_type(),
        torch::kBFloat16);
    EXPECT_EQ(
        ampp::dist::detail::fsdp_cast_input(*ampp::dist::detail::fsdp_unit_of(*low->blocks[0]), x.to(torch::kFloat))
            .scalar_type(),
        torch::kBFloat16);
  });
}

TEST(FullyShard, AForwardThroughAnotherModuleTypeIsRefused) {
  on_ranks(1, [](int, const ProcessGroup& pg) {
    auto model = make_stack(1);
    FullyShardedDataParallel fsdp(model, model->units(), FullyShardOptions().process_group(pg));
    AMPP_EXPECT_THROW_WITH(fsdp.forward<StackBlockImpl>(torch::randn({2, 12})), "the root module is not a");
  });
}

TEST(FullyShard, AUnitOutsideTheRootIsRefused) {
  on_ranks(1, [](int, const ProcessGroup& pg) {
    auto model = make_stack(1), other = make_stack(2);
    AMPP_EXPECT_THROW_WITH(FullyShardedDataParallel(model, other->units(), FullyShardOptions().process_group(pg)),
                           "is not a submodule of the root module");
  });
}

TEST(FullyShard, UnitsThatShareAParameterAreRefused) {
  on_ranks(1, [](int, const ProcessGroup& pg) {
    auto model = make_stack(1);
    auto units = model->units();
    units.push_back(units[0]);
    AMPP_EXPECT_THROW_WITH(FullyShardedDataParallel(model, units, FullyShardOptions().process_group(pg)),
                           "share a parameter");
  });
}

}  // namespace
}  // namespace ampp_test
