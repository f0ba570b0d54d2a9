#pragma once
// fp8 products with delayed scaling: TransformerEngine's DelayedScaling recipe, written from its documented
// formula. Each of a Linear's three float8 tensors (x, the weight, the output's gradient) gets its scale from
// the amaxes of earlier passes instead of from the tensor at hand, so a pass reads its tensor once:
//
//   amax  = the largest amax in the history (kMax) or its most recent one (kMostRecent)
//   scale = float32(F8MAX * 2^-margin) / amax     in float32; kept where amax is 0, inf or NaN;
//                                                 FLT_MAX where the quotient overflows (a tiny amax)
//
// A pass first folds its columns of the history in (the scale above, then the history rotated: the oldest
// entry dropped, row 0 zeroed), then casts with that scale and writes its tensor's amax to row 0.
// TransformerEngine folds after each pass instead; the next pass sees the same scales either way, and a
// checkpoint taken between steps holds the amaxes of the last step in row 0, as its history does before
// the fold. The forward folds x's and the weight's columns, the backward the gradient's. x and the weight
// are e4m3, the gradient e5m2 (TE's HYBRID format); the products are tensorwise's (float8.h).
//
// Where ampp differs from TransformerEngine:
// - Reducing the amaxes across ranks is the caller's (TE's reduce_amax): `ampp train` all-reduces row 0
//   (the max) after each step's backward, so every rank folds the same history.
// - A NaN in a tensor makes its amax NaN and the scale stays as it was (TE's fmaxf skips NaN values).
#include <ampp/precision/float8.h>

#include <torch/types.h>

namespace ampp {

// The delayed recipe's state for one Linear, float32 on the weight's device.
struct Float8DelayedState {
  torch::Tensor amax_history;  // [amax_history_len, 3]: columns x, weight, gradient; row 0 the last pass's
  torch::Tensor scale;         // [3]: the scales the last pass used (1 before the first pass)
};

// A state before any pass: an all-zero history of `amax_history_len` rows, scales of 1.
Float8DelayedState make_float8_delayed_state(int64_t amax_history_len, const torch::Device& device);

// y = x W^T + b with fp8 products scaled by `state` (config: its amax_compute_algo and margin). `record`:
// the pass advances the state (training); false: it uses the scales the next recorded pass would use and
// leaves the state as it was (evaluation). x [..., K], weight [N, K], bias [N] or undefined.
torch::Tensor float8_delayed_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                    const Float8LinearConfig& config, const Float8DelayedState& state, bool record);

// The scales ([3]: x, weight, gradient) the next recorded pass will cast with, from the state as it stands.
torch::Tensor float8_delayed_next_scales(const Float8DelayedState& state, const Float8LinearConfig& config);

}  // namespace ampp
