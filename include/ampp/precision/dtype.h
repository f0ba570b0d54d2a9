#pragma once
// The low-precision dtypes mixed precision runs in, and their one spelling ("bf16", "fp16").
#include <c10/core/ScalarType.h>

#include <string>

namespace ampp {

/// "bf16"/"bfloat16" -> kBFloat16, "fp16"/"float16"/"half" -> kHalf; anything else throws, naming
/// the valid spellings. `what` names the setting in the error (e.g. "TrainOptions::dtype").
c10::ScalarType parse_low_precision_dtype(const std::string& text, const std::string& what = "dtype");

/// "bf16" or "fp16"; other dtypes by their c10 name.
std::string low_precision_dtype_name(c10::ScalarType dtype);

}  // namespace ampp
