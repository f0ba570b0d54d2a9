// The fault source of the test-only `ampp-faults` binary (the CLI plus this file): faults read from the
// environment once, for the tests in this folder and scripts/chaos.py. Unset variables inject nothing.
//   AMPP_TRAIN_TEST_KILL_AT_STEP=N   the last rank SIGKILLs itself after step N (first attempt only)
//   AMPP_TRAIN_TEST_STOP_AT_STEP=N   the last rank SIGSTOPs itself after step N (first attempt only)
//   AMPP_TRAIN_TEST_INF_AT=S:R,...   rank R's loss is made inf at step S, so the step's gradients
//                                    overflow on every rank (every attempt: part of the run)
//   AMPP_TRAIN_TEST_KILL_IN_SAVE=N   rank 0 dies halfway through writing its N-th checkpoint
//                                    (1-based, first attempt only), leaving a partial temporary file
#include "ampp/train/fault_injection.h"

#include <ampp/util/parse_number.h>
#include <c10/util/Exception.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>

namespace ampp::train::detail {
namespace {

std::optional<int64_t> env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const auto value = parse_int(text);
  TORCH_CHECK(value, "environment variable ", name, "='", text, "' is not an integer");
  return value;
}

// "S:R,S:R,...": the steps at which `rank` injects.
std::set<int64_t> steps_of_rank(const char* name, int rank) {
  std::set<int64_t> steps;
  const char* text = std::getenv(name);
  std::stringstream list(text != nullptr ? text : "");
  for (std::string item; std::getline(list, item, ',');) {
    const size_t colon = item.find(':');
    const auto step = colon == std::string::npos ? std::nullopt : parse_int(item.substr(0, colon));
    const auto r = colon == std::string::npos ? std::nullopt : parse_int(item.substr(colon + 1));
    TORCH_CHECK(step && r, "environment variable ", name, ": '", item, "' is not STEP:RANK");
    if (*r == rank) steps.insert(*step);
  }
  return steps;
}

// What a kill in the middle of a checkpoint write leaves: half a temporary file.
void die_halfway_through_save(int64_t nth, int64_t step, const std::string& temporary,
                              const std::function<std::string()>& bytes) {
  if (nth != env_int("AMPP_TRAIN_TEST_KILL_IN_SAVE")) return;
  const std::string file = bytes();
  std::fprintf(stderr, "ampp train: test fault: rank 0 killed halfway through the checkpoint of step %lld\n",
               static_cast<long long>(step));
  std::ofstream(temporary, std::ios::binary).write(file.data(), static_cast<std::streamsize>(file.size() / 2));
  std::raise(SIGKILL);
}

FaultInjection from_environment(int rank, int world, bool restarted) {
  FaultInjection f;
  f.inf_steps = steps_of_rank("AMPP_TRAIN_TEST_INF_AT", rank);
  f.error_on_sync = env_int("AMPP_TRAIN_TEST_ERROR_ON_SYNC").value_or(0) != 0;
  if (restarted) return f;
  if (rank == world - 1) {
    const auto kill_at = env_int("AMPP_TRAIN_TEST_KILL_AT_STEP"), stop_at = env_int("AMPP_TRAIN_TEST_STOP_AT_STEP");
    f.after_step = [kill_at, stop_at](int64_t step) {
      if (kill_at == step) std::raise(SIGKILL);
      if (stop_at == step) std::raise(SIGSTOP);
    };
  }
  if (rank == 0 && env_int("AMPP_TRAIN_TEST_KILL_IN_SAVE")) f.before_save = die_halfway_through_save;
  return f;
}

const bool registered = (set_fault_source(&from_environment), true);

}  // namespace
}  // namespace ampp::train::detail
