#pragma once
// apex's optimisation levels O0..O3 (the letter O, then a digit).

#include <ostream>
#include <string>

namespace ampp {

enum class OptLevel {
  O0,  ///< pure FP32: the baseline
  O1,  ///< FP32 model, autocast inserts casts around ops (PyTorch's native AMP)
  O2,  ///< low-precision model except BatchNorm, FP32 master weights in the optimizer
  O3,  ///< pure low precision, no masters (speed baseline; small updates get lost)
};

/// "O0".."O3", exactly (case-sensitive, as apex). Anything else throws, naming the valid spellings.
OptLevel parse_opt_level(const std::string& text);

/// "O0".."O3".
const char* to_string(OptLevel level);

std::ostream& operator<<(std::ostream& os, OptLevel level);

}  // namespace ampp
