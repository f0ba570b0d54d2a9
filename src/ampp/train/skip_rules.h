#pragma once
// Internal to ampp: the trainer's two rules on skipped steps (TrainOptions::max_consecutive_skips = L): L
// skips in a row, or more than L of the last 2L steps, so that one finite step now and then does not hide
// a run that is skipping most of its steps. Fed each step's skip flag in order, on the host (the steps'
// flags wait on the device between two reads: step_tally.h); it remembers the first step that broke one.
#include <cstdint>
#include <deque>
#include <optional>

namespace ampp::train::detail {

class SkipRules {
 public:
  // What the rules saw at the first step that broke one.
  struct Break {
    int64_t step = 0;          // 1-based, among the steps these rules saw
    int64_t in_a_row = 0;      // skips in a row up to it
    int64_t recent_skips = 0;  // skips among the last `recent_steps` steps (at most 2L)
    int64_t recent_steps = 0;
  };

  explicit SkipRules(int64_t limit) : limit_(limit) {}  // 0: no rule (the streak is still counted)

  void add(bool skipped);
  int64_t in_a_row() const { return in_a_row_; }
  const std::optional<Break>& first_break() const { return first_break_; }

 private:
  int64_t limit_;
  int64_t steps_ = 0, in_a_row_ = 0, recent_skipped_ = 0;
  std::deque<bool> recent_;  // the last 2L steps: skipped or not
  std::optional<Break> first_break_;
};

}  // namespace ampp::train::detail
