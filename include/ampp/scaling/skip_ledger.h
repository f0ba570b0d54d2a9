#pragma once
// ampp::SkipLedger: the one record of which optimizer steps were skipped for inf/NaN gradients.

#include <torch/types.h>

#include <cstdint>

namespace ampp {

/// Note [the skip ledger]
/// ~~~~~~~~~~~~~~~~~~~~~~
/// A step is skipped when its gradients hold an inf or a NaN. Whoever decides that writes the decision
/// here, once per step, as one flag named `skipped` (float32, 0-dim, non-zero: the step was skipped):
/// GradScaler::step for a loop of one's own, Amp::step for apex's loops and `ampp train`. Everything
/// else about skips is read from the ledger and derived from nothing else: the last step's flag, how many
/// steps were skipped, and how many were taken (an lr schedule's position).
///
/// Before the decision there is only a check's result: GradScaler's `found_inf` (PyTorch's name), which
/// Amp sums over a step's backwards as its pending flag. The decision, once made, is `skipped`, and only the
/// ledger holds it.
///
/// The ledger lives where the decision is made. A fused optimizer decides on the device, and recording
/// its flag is three tensor operations there: no host read, so a CUDA graph captures it and every replay
/// records. The host counts only the steps themselves; the flag and the counts are read on the host when
/// asked (last_skipped(), skipped(), taken()), each a synchronisation on a GPU.
class SkipLedger {
 public:
  /// One step decided on the device: `skipped` is 0-dim, non-zero where the step was skipped.
  void record(const torch::Tensor& skipped);
  /// One step decided on the host (or by nothing: false).
  void record(bool skipped);

  /// Steps recorded (known on the host: no read).
  int64_t steps() const { return steps_; }
  /// Host reads.
  bool last_skipped() const;
  int64_t skipped() const;
  int64_t taken() const { return steps_ - skipped(); }

  /// The last step's flag where it was decided (float32, 0-dim; undefined before the first step). The
  /// same tensor, updated in place, from then on (a captured graph's replays update it).
  const torch::Tensor& skipped_flag() const { return last_; }
  /// The count of skipped steps where the decisions are (int64, 0-dim; undefined before the first step),
  /// for a caller that reads it together with other values in one synchronisation.
  const torch::Tensor& skipped_count() const { return skipped_; }
  /// The steps taken, int64 0-dim, on `device`: what an lr schedule on the device indexes with. Moves the
  /// ledger there if it is elsewhere (once, before the steps are recorded there).
  const torch::Tensor& taken_on(const torch::Device& device);

  /// Counts from a checkpoint: `taken` steps taken and `skipped` skipped so far.
  void restore(int64_t taken, int64_t skipped);
  /// An independent copy (the tensors cloned).
  SkipLedger clone() const;

 private:
  void place(const torch::Device& device);

  int64_t steps_ = 0;
  torch::Tensor last_;     // float32 0-dim: the last step's flag
  torch::Tensor skipped_;  // int64 0-dim: steps skipped
  torch::Tensor taken_;    // int64 0-dim: steps taken
};

}  // namespace ampp
