// The evaluation's batch (issue 52, defect 3): one training micro-batch of the rank, so evaluating needs no
// more memory than a training step. A fixed 512 sequences made gpt2-124m's float32 logits [512, 1024, 50257]
// 105 GB, and gpt-mini's peak twice its nanoGPT twin's.

#include "ampp/train/evaluation.h"

#include <gtest/gtest.h>

TEST(Evaluation, BatchesAreOneTrainingMicroBatch) {
  using ampp::train::detail::evaluation_batch;
  EXPECT_EQ(evaluation_batch(32, 1), 32);
  EXPECT_EQ(evaluation_batch(32, 4), 8);  // --grad-accum 4: a micro-batch is a quarter of the rank's batch
  EXPECT_EQ(evaluation_batch(1, 1), 1);
  EXPECT_EQ(evaluation_batch(8, 16), 1);  // never empty
}
