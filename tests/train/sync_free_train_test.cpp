// `ampp train`'s step reads nothing on the host, at every opt level. On the CPU the run takes the step a
// GPU run takes (--fused-optimizer --host-reads log-points: ampp::FusedSGD, which skips on the device, and
// the host reading the steps' results only every --log-every steps), and twice as many steps must make no
// more host reads (aten::item) than half as many: every read the run makes is at a read point, the
// evaluation or the outputs, none in a step. The GPU suite checks the same under c10's sync debug mode
// (GpuTrain.TheEagerStepReadsNothingOnTheHostBetweenLogPointsAtEveryOptLevel).
#include <ampp/train/options.h>
#include <ampp/train/trainer.h>
#include <ampp/util/torch_version.h>

#include "ampp/train/fault_injection.h"
#include "ampp_test.h"
#include "host_reads.h"

namespace sync_free_train_test {

using ampp::OptLevel;
using ampp::train::TrainOptions;
using ampp::train::detail::FaultInjection;

FaultInjection an_inf(int, int, bool) {
  FaultInjection f;
  f.inf_steps = {3};
  return f;
}
FaultInjection no_faults(int, int, bool) { return {}; }

struct Reads {
  int count;
  ampp::train::Summary summary;
};

// One epoch of `images` synthetic images in batches of 32, read only at its end (--log-every 1000).
Reads host_reads_of(const std::filesystem::path& out, OptLevel level, c10::ScalarType dtype, int64_t images) {
  const auto options = TrainOptions()
                           .data("synthetic:" + std::to_string(images))
                           .opt_level(level)
                           .dtype(dtype)
                           .batch_size(32)
                           .epochs(1)
                           .log_every(1000)
                           .host_reads(ampp::train::HostReads::kLogPoints)  // as on a GPU
                           .fused_optimizer(true)
                           .threads(1)
                           .progress(false)
                           .plots(false)
                           .out(out.string());
  ampp_test::HostReadCounter counter;
  auto summary = ampp::train::train(options);
  return {counter.count(), summary};
}

}  // namespace sync_free_train_test

TEST(SyncFreeTrain, TwiceTheStepsMakeNoMoreHostReadsAtEveryOptLevel) {
  using namespace sync_free_train_test;
  if (!AMPP_TORCH_AT_LEAST(2, 4)) GTEST_SKIP() << "ATen's fused SGD kernel needs LibTorch 2.4 or newer";
  ampp::train::detail::set_fault_source(an_inf);
  const std::vector<std::tuple<std::string, OptLevel, c10::ScalarType>> levels{
      {"O0", OptLevel::O0, torch::kBFloat16},      {"O1 fp16", OptLevel::O1, torch::kHalf},
      {"O1 bf16", OptLevel::O1, torch::kBFloat16}, {"O2 fp16", OptLevel::O2, torch::kHalf},
      {"O2 bf16", OptLevel::O2, torch::kBFloat16}, {"O3 bf16", OptLevel::O3, torch::kBFloat16}};
  for (const auto& [name, level, dtype] : levels) {
    SCOPED_TRACE(name);
    ampp_test::TempDir tmp;
    const Reads short_run = host_reads_of(tmp.path() / "short", level, dtype, 20 * 32);
    const Reads long_run = host_reads_of(tmp.path() / "long", level, dtype, 40 * 32);
    EXPECT_EQ(short_run.summary.steps, 20);
    EXPECT_EQ(long_run.summary.steps, 40);
    // The inf at step 3, skipped on the device (fp16's first steps may overflow at the initial scale too).
    EXPECT_GE(long_run.summary.skipped_steps, 1);
    EXPECT_EQ(long_run.count, short_run.count)
        << "20 more steps made " << long_run.count - short_run.count << " more host reads";
  }
  ampp::train::detail::set_fault_source(no_faults);
}
