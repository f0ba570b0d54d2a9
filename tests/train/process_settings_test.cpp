// train() and the process-wide settings it changes (issue 52, defects 2 and 12): `--deterministic` gives cuBLAS
// the reproducible workspace LibTorch's deterministic mode demands on CUDA (without it the first cuBLAS product
// throws), and a run leaves deterministic algorithms, cuDNN's benchmark mode and the environment as it found them.

#include "ampp/train/process_settings.h"

#include <ampp/train/trainer.h>

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "ampp_test.h"

namespace {

using ampp::train::TrainOptions;
using ampp::train::detail::ProcessSettingsScope;

std::string cublas_workspace() {
  const char* v = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  return v ? v : "<unset>";
}

// Clears what a test may set, before and after it.
struct CleanSettings {
  CleanSettings() { reset(); }
  ~CleanSettings() { reset(); }
  static void reset() {
    ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
    at::globalContext().setDeterministicAlgorithms(false, false);
    at::globalContext().setBenchmarkCuDNN(false);
  }
};

TEST(ProcessSettings, DeterministicSetsCublasWorkspaceForTheRunOnly) {
  CleanSettings clean;
  {
    const ProcessSettingsScope scope(TrainOptions().deterministic(true));
    EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
    EXPECT_FALSE(at::globalContext().deterministicAlgorithmsWarnOnly());
    EXPECT_EQ(cublas_workspace(), ":4096:8");
    at::globalContext().setBenchmarkCuDNN(true);  // as a CUDA run does (run.cpp)
  }
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_FALSE(at::globalContext().benchmarkCuDNN());
  EXPECT_EQ(cublas_workspace(), "<unset>");
}

TEST(ProcessSettings, AUsersCublasWorkspaceIsKept) {
  CleanSettings clean;
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  {
    const ProcessSettingsScope scope(TrainOptions().deterministic(true));
    EXPECT_EQ(cublas_workspace(), ":16:8");
  }
  EXPECT_EQ(cublas_workspace(), ":16:8");
}

TEST(ProcessSettings, WithoutDeterministicNothingIsSet) {
  CleanSettings clean;
  const ProcessSettingsScope scope{TrainOptions()};
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_EQ(cublas_workspace(), "<unset>");
}

TEST(ProcessSettings, ADeterministicTrainingLeavesTheProcessAsItFoundIt) {
  CleanSettings clean;
  ampp_test::TempDir tmp;
  const auto summary = ampp::train::train(TrainOptions()
                                              .data("synthetic:64")
                                              .batch_size(32)
                                              .epochs(1)
                                              .threads(1)
                                              .deterministic(true)
                                              .progress(false)
                                              .plots(false)
                                              .out((tmp.path() / "out").string()));
  EXPECT_EQ(summary.steps, 2);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms()) << "train() left deterministic algorithms on";
  EXPECT_EQ(cublas_workspace(), "<unset>");
}

}  // namespace
