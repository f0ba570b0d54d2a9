#pragma once
// Internal to ampp: the process-wide LibTorch settings a run changes (deterministic algorithms, cuDNN's
// benchmark mode, cuBLAS's workspace configuration), set for the run and restored when it ends, so that
// train() leaves the process as it found it.
#include <ampp/train/options.h>

#include <optional>
#include <string>

namespace ampp::train::detail {

// What `TrainOptions::deterministic` needs of cuBLAS: LibTorch's deterministic mode (warn_only=false) throws
// at the first cuBLAS product unless CUBLAS_WORKSPACE_CONFIG is ":4096:8" or ":16:8" (CUDA's documented
// reproducible settings), which must be in the environment before cuBLAS makes its handle. A value the user
// set is kept.
inline constexpr const char* kDeterministicCublasWorkspace = ":4096:8";

class ProcessSettingsScope {
 public:
  // Saves the settings, then sets deterministic algorithms (and cuBLAS's workspace) when `o.deterministic()`.
  // The run may change cuDNN's benchmark mode (run.cpp); the destructor restores all of them.
  explicit ProcessSettingsScope(const TrainOptions& o);
  ~ProcessSettingsScope();
  ProcessSettingsScope(const ProcessSettingsScope&) = delete;
  ProcessSettingsScope& operator=(const ProcessSettingsScope&) = delete;

 private:
  bool deterministic_, deterministic_warn_only_, cudnn_benchmark_;
  std::optional<std::string> cublas_workspace_;  // before the run; nullopt: unset
};

}  // namespace ampp::train::detail
