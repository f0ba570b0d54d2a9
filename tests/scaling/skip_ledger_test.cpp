// SkipLedger: the one record of skipped steps (Note [the skip ledger], skip_ledger.h). It counts each step from
// its flag where the flag is, reading nothing; the host reads it only on request; GradScaler's public counters
// are reads of it, whichever path decided the skip.
#include <ampp/scaling/fused_optimizers.h>
#include <ampp/scaling/skip_ledger.h>
#include <ampp/util/torch_version.h>

#include "host_reads.h"
#include "scaler_test_util.h"

namespace {

using ampp_test::kInf;
using ampp_test::kNaN;

}  // namespace

TEST(SkipLedger, CountsEachStepFromItsFlagWithoutReadingIt) {
  ampp::SkipLedger ledger;
  EXPECT_FALSE(ledger.skipped_flag().defined());
  const std::vector<float> flags{0.0F, kInf, 0.0F, kNaN, 1.0F, 0.0F};
  {
    ampp_test::HostReadCounter reads;
    for (float f : flags) ledger.record(torch::tensor(f));
    EXPECT_EQ(reads.count(), 0);
  }
  const void* flag_storage = ledger.skipped_flag().data_ptr();
  EXPECT_EQ(ledger.steps(), 6);
  EXPECT_EQ(ledger.skipped(), 3);  // inf, NaN and 1: any non-zero flag
  EXPECT_EQ(ledger.taken(), 3);
  EXPECT_FALSE(ledger.last_skipped());
  ledger.record(torch::tensor(kInf));
  EXPECT_TRUE(ledger.last_skipped());
  EXPECT_EQ(ledger.skipped_flag().data_ptr(), flag_storage) << "the flag is updated in place (a graph replays it)";
  EXPECT_EQ(ledger.skipped_flag().scalar_type(), torch::kFloat);
  EXPECT_EQ(ledger.taken_on(torch::kCPU).item<int64_t>(), 3);
}

TEST(SkipLedger, HostDecisionsACheckpointsCountsAndCopiesAgree) {
  ampp::SkipLedger ledger;
  ledger.record(true);
  ledger.record(false);
  EXPECT_EQ(ledger.steps(), 2);
  EXPECT_EQ(ledger.skipped(), 1);
  EXPECT_FALSE(ledger.last_skipped());
  ledger.restore(/*taken=*/7, /*skipped=*/3);
  EXPECT_EQ(ledger.steps(), 10);
  EXPECT_EQ(ledger.skipped(), 3);
  EXPECT_EQ(ledger.taken_on(torch::kCPU).item<int64_t>(), 7);
  ampp::SkipLedger copy = ledger.clone();
  copy.record(torch::tensor(kInf));
  EXPECT_EQ(copy.skipped(), 4);
  EXPECT_EQ(ledger.skipped(), 3) << "a clone shares no tensor";
  EXPECT_THROW(ledger.record(torch::zeros({2})), c10::Error);
  EXPECT_THROW(ledger.restore(-1, 0), c10::Error);
}

// GradScaler's found_inf_last_step(), skipped_steps() and found_inf_on_device() are its ledger's, on the host
// path (torch::optim::SGD) and the fused one (FusedSGD), and its state dict carries the ledger's count.
TEST(SkipLedger, GradScalersCountersAreReadsOfItsLedgerOnEitherPath) {
  for (const bool fused : {false, true}) {
    if (fused && !AMPP_TORCH_AT_LEAST(2, 4)) continue;  // ATen's fused kernels
    torch::Tensor p = torch::ones({4}).requires_grad_();
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (fused)
      opt = std::make_unique<ampp::FusedSGD>(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(0.01));
    else
      opt = std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(0.01));
    ampp::GradScaler scaler;
    for (int step = 0; step < 5; ++step) {
      opt->zero_grad();
      scaler.scale((p * torch::arange(1, 5, torch::kFloat)).sum()).backward();
      if (step == 1 || step == 2) p.mutable_grad()[2].fill_(kInf);
      scaler.step(*opt);
      scaler.update();
      EXPECT_EQ(scaler.found_inf_last_step(), step == 1 || step == 2) << fused << " step " << step;
    }
    const ampp::SkipLedger& ledger = scaler.ledger();
    EXPECT_EQ(ledger.steps(), 5) << fused;
    EXPECT_EQ(ledger.skipped(), 2) << fused;
    EXPECT_EQ(scaler.skipped_steps(), ledger.skipped()) << fused;
    EXPECT_TRUE(scaler.found_inf_on_device().is_same(ledger.skipped_flag())) << fused;
    ampp::GradScaler resumed;
    resumed.load_state_dict(scaler.state_dict());
    EXPECT_EQ(resumed.ledger().skipped(), 2) << fused;
  }
}
