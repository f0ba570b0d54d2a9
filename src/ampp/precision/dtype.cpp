#include <ampp/precision/dtype.h>

#include <c10/util/Exception.h>

namespace ampp {

c10::ScalarType parse_low_precision_dtype(const std::string& text, const std::string& what) {
  if (text == "bf16" || text == "bfloat16") return c10::kBFloat16;
  if (text == "fp16" || text == "float16" || text == "half") return c10::kHalf;
  TORCH_CHECK(false, what, " '", text, "' is not a low-precision dtype; use bf16 or fp16");
}

std::string low_precision_dtype_name(c10::ScalarType dtype) {
  if (dtype == c10::kBFloat16) return "bf16";
  if (dtype == c10::kHalf) return "fp16";
  return c10::toString(dtype);
}

}  // namespace ampp
