#include "divergence.h"
#include "outputs.h"

namespace ampp::train::detail {

namespace {

// "the last of them had inf/NaN gradients in fc1.weight, fc1.bias and 4 more".
std::string where_it_overflowed(const std::vector<std::string>& names) {
  if (names.empty()) return "no parameter gradient of the last one was non-finite on this rank";
  const size_t shown = std::min<size_t>(names.size(), 3);
  std::string list =
      fmt::format("{}", fmt::join(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown), ", "));
  if (names.size() > shown) list += fmt::format(" and {} more", names.size() - shown);
  return "the last of them had inf/NaN gradients in " + list;
}

// What to try, from what the run was doing when its gradients stayed non-finite.
std::string divergence_hint(const Run& run) {
  const LossScale& scale = run.amp.properties().loss_scale();
  const std::string lr = fmt::format("TrainOptions::lr ({:g})", *run.o.lr());
  if (run.amp.checks_overflow() && !scale.is_dynamic() && scale.value() > 1)
    return fmt::format(
        "the static loss scale {:g} may overflow the {} gradients: use TrainOptions::loss_scale "
        "dynamic or a smaller value; or lower {}",
        scale.value(), low_precision_dtype_name(run.o.dtype()), lr);
  if (run.amp.checks_overflow() && scale.is_dynamic())
    return fmt::format(
        "the dynamic loss scale backed off to {:g}, so this is not a loss-scale overflow; lower {} "
        "(or check the data){}",
        run.amp.loss_scale(), lr,
        run.o.dtype() == c10::kHalf ? ", or try TrainOptions::dtype bf16 (fp32's range)" : "");
  return "lower " + lr + " (or check the data)";
}

// Ends the run with an error: a diverged run must not end "successfully" with a useless model. Every
// rank reaches the same decision at the same step (global overflow flag, averaged gradients, the
// same weights), so every rank stops alike.
[[noreturn]] void stop_diverged(Run& run, const std::string& what) {
  const std::string loss = std::isnan(run.report.last_finite_loss)
                               ? std::string("no step of this process had a finite loss")
                               : fmt::format("the last finite loss was {:.6g} at step {}", run.report.last_finite_loss,
                                             run.report.last_finite_loss_step);
  const std::string message =
      fmt::format("the run diverged: {}; {}; {}. Likely fix: {}. model.pt was not written", what, loss,
                  where_it_overflowed(run.report.last_overflowed), divergence_hint(run));
  if (run.report.metrics)
    run.report.metrics->write_line(
        {{"type", "error"}, {"cause", "diverged"}, {"step", run.position.global_step}, {"message", message}});
  write_doctor_outputs(run);  // a diverged run is what the doctor is for
  TORCH_CHECK(false, message);
}

// Divergence by skipped steps (TrainOptions::max_consecutive_skips = L, 0: never): L in a row, or more
// than L of the last 2L, so that one finite step now and then does not hide a run that is skipping
// most of its steps. Shorter runs are caught by their non-finite weights or final loss
// (check_finite_weights, check_final_loss). The rule a step `last` broke with `in_a_row` skips in a row and
// `recent_skipped` of the last `recent_steps`, said; "" when it broke none.
std::string broken_skip_rule(int64_t limit, int64_t in_a_row, int64_t recent_skipped, int64_t recent_steps,
                             int64_t last) {
  if (limit > 0 && in_a_row >= limit)
    return fmt::format(
        "steps {} to {} ({} in a row, TrainOptions::max_consecutive_skips) had inf/NaN "
        "gradients and were skipped (no step was taken on them)",
        last - in_a_row + 1, last, in_a_row);
  if (limit > 0 && recent_skipped > limit)
    return fmt::format(
        "{} of the last {} steps (to step {}) had inf/NaN gradients and were skipped, more "
        "than TrainOptions::max_consecutive_skips ({}) in twice that many steps",
        recent_skipped, recent_steps, last, limit);
  return "";
}

}  // namespace

// The steps since the last read into the epoch's sums and the position, and the last step as the host
// sees it. A host synchronisation.
StepResult read_steps(Run& run, const detail::StepTally::Readout& r) {
  run.sums.loss_sum += r.loss_sum;
  run.sums.correct += r.correct;
  run.sums.seen += r.seen;
  run.position.skipped_total = r.skipped_total;  // the skip ledger's (Note [the skip ledger])
  StepResult step;
  step.loss = r.last_loss;
  step.stepped = r.consecutive_skips == 0;
  if (!step.stepped) step.overflowed = run.report.step_overflowed;
  return step;
}

// The rules saw every step's skip flag in order at the read (skip_rules.h), so they name the first step
// that broke one, also where finite steps followed it before the read, and every rank stops at the same read.
void check_divergence(Run& run, const StepResult& step, const detail::StepTally::Readout& r) {
  if (std::isfinite(step.loss)) {
    run.report.last_finite_loss = step.loss;
    run.report.last_finite_loss_step = run.position.global_step;
  }
  if (!step.stepped) run.report.last_overflowed = step.overflowed;
  if (!r.first_break) return;
  const int64_t limit = run.o.max_consecutive_skips();
  const auto& broke = *r.first_break;
  const int64_t step_of_break = run.position.global_step - (r.steps - broke.step);
  stop_diverged(run, broken_skip_rule(limit, broke.in_a_row, broke.recent_skips, broke.recent_steps, step_of_break));
}

namespace {

// `ampp doctor` (doctor on, no divergence stop): a diagnosis runs every step and reports instead of
// failing; it still never saves non-finite weights.
bool diagnosis_only(const TrainOptions& o) { return o.doctor() && o.max_consecutive_skips() == 0; }

}  // namespace

// The weights (and O2's masters) must be finite before they are saved anywhere: a step taken on
// finite gradients can still overflow them (fp16 at O3, a huge learning rate). The checkpoint already
// on disk then keeps the last finite weights. false: not finite, in a diagnosis run.
bool check_finite_weights(Run& run) {
  std::vector<torch::Tensor> weights = run.amp.master_params();
  for (const auto& p : run.model->parameters()) weights.push_back(p);
  for (const auto& b : run.model->buffers())
    if (b.is_floating_point()) weights.push_back(b);
  if (!numerics::has_non_finite(weights)) return true;
  if (diagnosis_only(run.o)) return false;
  std::vector<std::string> names;
  for (const auto& item : run.model->named_parameters())
    if (!torch::isfinite(item.value()).all().item<bool>()) names.push_back(item.key());
  run.report.last_overflowed = names;
  stop_diverged(run, fmt::format("after step {} the weights hold inf/NaN values{}", run.position.global_step,
                                 run.checkpoint.empty() ? "" : " (the last checkpoint keeps the last finite ones)"));
}

bool check_final_loss(Run& run) {
  if (std::isfinite(run.report.last_eval.loss)) return true;
  if (diagnosis_only(run.o)) return false;
  stop_diverged(run, fmt::format("after step {} the test loss is not finite ({})", run.position.global_step,
                                 run.report.last_eval.loss));
}

}  // namespace ampp::train::detail
