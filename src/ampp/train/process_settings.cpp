#include "process_settings.h"

#include <ATen/Context.h>

#include <cstdlib>

namespace ampp::train::detail {

ProcessSettingsScope::ProcessSettingsScope(const TrainOptions& o)
    : deterministic_(at::globalContext().deterministicAlgorithms()),
      deterministic_warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()),
      cudnn_benchmark_(at::globalContext().benchmarkCuDNN()) {
  if (const char* v = std::getenv("CUBLAS_WORKSPACE_CONFIG")) cublas_workspace_ = v;
  if (!o.deterministic()) return;
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  if (!cublas_workspace_) ::setenv("CUBLAS_WORKSPACE_CONFIG", kDeterministicCublasWorkspace, /*overwrite=*/0);
}

ProcessSettingsScope::~ProcessSettingsScope() {
  at::globalContext().setDeterministicAlgorithms(deterministic_, deterministic_warn_only_);
  at::globalContext().setBenchmarkCuDNN(cudnn_benchmark_);
  if (!cublas_workspace_) ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
}

}  // namespace ampp::train::detail
