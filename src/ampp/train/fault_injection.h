#pragma once
// Testing aids for the recovery, stall and chaos tests (tests/train, scripts/chaos.py), read from
// the environment once. Unset in normal use; each costs an integer comparison per step.
//   AMPP_TRAIN_TEST_KILL_AT_STEP=N   the last rank SIGKILLs itself after step N (first attempt only)
//   AMPP_TRAIN_TEST_STOP_AT_STEP=N   the last rank SIGSTOPs itself after step N (first attempt only)
//   AMPP_TRAIN_TEST_INF_AT=S:R,...   rank R's loss is made inf at step S, so the step's gradients
//                                    overflow on every rank (every attempt: part of the run)
//   AMPP_TRAIN_TEST_KILL_IN_SAVE=N   rank 0 dies halfway through writing its N-th checkpoint
//                                    (1-based, first attempt only), leaving a partial temporary file
#include <cstdint>
#include <set>

namespace ampp::train::detail {

struct FaultInjection {
  int64_t kill_at_step = -1;
  int64_t stop_at_step = -1;
  std::set<int64_t> inf_steps;  // this rank's
  int64_t kill_in_save = -1;

  static FaultInjection from_environment(int rank, int world, bool restarted);
};

}  // namespace ampp::train::detail
