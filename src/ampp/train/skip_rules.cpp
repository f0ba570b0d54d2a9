// SkipRules (skip_rules.h): the divergence rules on skipped steps.
#include "skip_rules.h"

namespace ampp::train::detail {

void SkipRules::add(bool skipped) {
  ++steps_;
  in_a_row_ = skipped ? in_a_row_ + 1 : 0;
  if (limit_ == 0) return;
  recent_.push_back(skipped);
  recent_skipped_ += skipped ? 1 : 0;
  if (static_cast<int64_t>(recent_.size()) > 2 * limit_) {
    recent_skipped_ -= recent_.front() ? 1 : 0;
    recent_.pop_front();
  }
  if (!first_break_ && (in_a_row_ >= limit_ || recent_skipped_ > limit_))
    first_break_ = Break{steps_, in_a_row_, recent_skipped_, static_cast<int64_t>(recent_.size())};
}

}  // namespace ampp::train::detail
