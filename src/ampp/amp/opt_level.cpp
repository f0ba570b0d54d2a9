#include <ampp/amp/opt_level.h>

#include <c10/util/Exception.h>

namespace ampp {

OptLevel parse_opt_level(const std::string& text) {
  if (text == "O0") return OptLevel::O0;
  if (text == "O1") return OptLevel::O1;
  if (text == "O2") return OptLevel::O2;
  if (text == "O3") return OptLevel::O3;
  // Common slips get a pointed hint: a digit zero instead of the letter O, or lower case.
  std::string hint;
  if (!text.empty() && text[0] == '0') hint = " The prefix is the letter O, not the digit zero.";
  if (!text.empty() && text[0] == 'o') hint = " The prefix is a capital O.";
  TORCH_CHECK(false, "Unexpected optimization level '", text,
              "'. Options are 'O0', 'O1', 'O2', 'O3' (or ampp::OptLevel::O0..O3).", hint);
}

const char* to_string(OptLevel level) {
  switch (level) {
    case OptLevel::O0:
      return "O0";
    case OptLevel::O1:
      return "O1";
    case OptLevel::O2:
      return "O2";
    case OptLevel::O3:
      return "O3";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, OptLevel level) { return os << to_string(level); }

}  // namespace ampp
