#pragma once
// Internal to ampp: what `ampp train`'s steps leave on the device between two reads. Each step adds its
// loss and its correct predictions there, and writes its skip flag into a ring, with tensor operations only
// (a CUDA graph captures them; about 9 small kernels a step). The trainer reads it (one host
// synchronisation) every TrainOptions::log_every steps, at an epoch's end, before a checkpoint and
// wherever it must know at once (on the CPU, where a read costs nothing, every step); a read feeds the
// skip flags since the last one, in order, to the divergence rules (skip_rules.h), on the host.
#include "skip_rules.h"

#include <ampp/scaling/skip_ledger.h>

#include <torch/torch.h>

#include <optional>

namespace ampp::train::detail {

// Of a batch's predictions (argmax over the last dimension), those equal to `target`: 0-dim int64, where
// the logits are.
inline torch::Tensor correct_prediction_count(const torch::Tensor& logits, const torch::Tensor& target) {
  return logits.argmax(-1).eq(target).sum();
}

class StepTally {
 public:
  // One step's results, on the device.
  struct Step {
    torch::Tensor logits, loss;  // detached
    torch::Tensor skipped;       // the skip ledger's flag: float32 0-dim, non-zero: the step was skipped
  };

  // What the steps since the last read added up, and where the skips stand (host values).
  struct Readout {
    double loss_sum = 0;  // each step's loss times its targets
    double correct = 0;
    double seen = 0;
    double last_loss = 0;
    int64_t skipped_total = 0;                    // the skip ledger's count of skipped steps
    int64_t consecutive_skips = 0;                // of the last steps, in a row (0: the last one stepped)
    int64_t steps = 0;                            // added since the start
    std::optional<SkipRules::Break> first_break;  // the first step that broke a divergence rule
  };

  // `max_consecutive_skips`: TrainOptions' (the rules' L); at most `steps_between_reads` steps come between
  // two reads (TrainOptions::log_every), the size of the ring of skip flags.
  StepTally(int64_t max_consecutive_skips, int64_t steps_between_reads);

  // Adds a step on `target`'s batch: add_on_device() and count().
  void add(const Step& step, const torch::Tensor& target) {
    add_on_device(step, target);
    count(target.numel());
  }
  // The device's part: tensor operations only, which a CUDA graph captures and each replay repeats.
  void add_on_device(const Step& step, const torch::Tensor& target);
  // The host's part, once per step whether it ran eagerly or as a replay: its targets.
  void count(int64_t targets) {
    seen_ += static_cast<double>(targets);
    ++steps_;
  }
  // Reads what was added since the last read (and restarts those sums), with `ledger`'s count of skipped
  // steps: one host synchronisation for both.
  Readout read(const SkipLedger& ledger);

 private:
  SkipRules rules_;
  int64_t ring_size_;
  torch::Tensor loss_sum_, correct_, last_loss_;  // float64, int64, float32: made by the first step
  torch::Tensor skip_ring_, cursor_;              // float32 [ring_size_]; int64 0-dim: the next slot
  double seen_ = 0;                               // known on the host: the targets of each step
  int64_t steps_ = 0, steps_read_ = 0;            // added, and added up to the last read
};

}  // namespace ampp::train::detail
