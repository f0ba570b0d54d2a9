#pragma once
// Internal to ampp: TrainOptions::cuda_graphs' divergence watch. The eager trainer stops a run whose
// steps are skipped for inf/NaN gradients (TrainOptions::max_consecutive_skips = L): L in a row, or more
// than L of the last 2L. A graphed step is read only every N steps, so its skips are watched on the
// device, step by step, without a host read: a read then learns the first step that broke a rule.
#include <torch/torch.h>

#include <optional>

namespace ampp::train::detail {

class SkipWatch {
 public:
  // What the rules saw at the first step that broke one.
  struct Break {
    int64_t step = 0;          // 1-based, among the steps this watch saw
    int64_t in_a_row = 0;      // skips in a row up to it
    int64_t recent_skips = 0;  // skips among the last min(step, 2L) steps
  };

  explicit SkipWatch(int64_t limit) : limit_(limit) {}

  // After a step, on the device: `found_inf` (0-dim, non-zero = the step was skipped). Capturable.
  void after_step(const torch::Tensor& found_inf);
  // The first break since the start, if any (a host read).
  std::optional<Break> first_break() const;

 private:
  int64_t limit_;              // 0: never stop, nothing watched
  torch::Tensor ring_;         // int64 [2L]: 1 where that step was skipped, by step number modulo 2L
  torch::Tensor state_;        // int64 [3]: steps seen, skips in a row, skips in the ring
  torch::Tensor first_break_;  // int64 [3]: as Break, step -1 until a rule breaks
};

}  // namespace ampp::train::detail
