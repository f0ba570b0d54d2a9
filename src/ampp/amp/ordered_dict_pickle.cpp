// Pickle opcodes are walked by their argument lengths (Python's pickletools documents each), so the
// rewrite never mistakes data bytes for opcodes.
#include "ordered_dict_pickle.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <set>

namespace ampp::detail {
namespace {

uint32_t le32(const std::string& p, size_t at) {
  TORCH_CHECK(at + 4 <= p.size(), "truncated pickle");
  uint32_t v = 0;
  std::memcpy(&v, p.data() + at, 4);  // little-endian, as pickle and every platform LibTorch supports
  return v;
}

// Bytes of the argument of opcode `op` starting at `at` (after the opcode byte).
size_t argument_length(char op, const std::string& p, size_t at) {
  auto line = [&](size_t from) {
    const size_t end = p.find('\n', from);
    TORCH_CHECK(end != std::string::npos, "truncated pickle");
    return end + 1 - from;
  };
  switch (op) {
    case 'K':
    case 'h':
    case 'q':
    case '\x80':
    case '\x82':
      return 1;  // BININT1 BINGET BINPUT PROTO EXT1
    case 'M':
    case '\x83':
      return 2;  // BININT2 EXT2
    case 'J':
    case 'j':
    case 'r':
    case '\x84':
      return 4;  // BININT LONG_BINGET LONG_BINPUT EXT4
    case 'G':
      return 8;  // BINFLOAT
    case 'U':
    case 'C':
    case '\x8a':  // SHORT_BINSTRING/BYTES, LONG1
      TORCH_CHECK(at < p.size(), "truncated pickle");
      return 1 + static_cast<uint8_t>(p[at]);
    case 'T':
    case 'X':
    case 'B':
    case '\x8b':
      return 4 + le32(p, at);  // BINSTRING BINUNICODE BINBYTES LONG4
    case 'c':
    case 'i': {
      const size_t first = line(at);
      return first + line(at + first);
    }  // GLOBAL INST
    case 'I':
    case 'L':
    case 'F':
    case 'S':
    case 'V':
    case 'P':
    case 'g':
    case 'p':
      return line(at);
    default:
      TORCH_CHECK(std::strchr("(.012NRabd}el]ostu)\x85\x86\x87\x88\x89\x81Q", op) != nullptr && op != '\0',
                  "unsupported pickle opcode 0x", std::hex, static_cast<int>(static_cast<uint8_t>(op)),
                  " (torch.save writes protocol 2)");
      return 0;
  }
}

uint32_t memo_index(char op, const std::string& p, size_t at) {
  return op == 'q' || op == 'h' ? static_cast<uint8_t>(p[at]) : le32(p, at);
}

}  // namespace

std::string plain_dicts(const std::string& p) {
  static const std::string kOrderedDict = "collections\nOrderedDict\n";
  std::set<uint32_t> ordered_dict_memo;  // memo slots holding the OrderedDict class
  std::string out;
  size_t at = 0;
  char previous = 0;
  bool pending = false;  // an OrderedDict() call is being replaced: drop its EMPTY_TUPLE and REDUCE
  while (at < p.size()) {
    const char op = p[at];
    const size_t n = argument_length(op, p, at + 1);
    const std::string whole = p.substr(at, 1 + n);
    at += 1 + n;
    const bool is_get = op == 'h' || op == 'j', is_put = op == 'q' || op == 'r';
    if ((op == 'c' && whole.compare(1, std::string::npos, kOrderedDict) == 0) ||
        (is_get && ordered_dict_memo.count(memo_index(op, whole, 1)))) {
      out += '}', pending = true;  // the class becomes the empty dict the call would have made
    } else if (is_put && pending && previous == 'c') {
      ordered_dict_memo.insert(memo_index(op, whole, 1));  // the memo keeps its numbering
      out += whole;
    } else if (pending && (op == ')' || op == 'R')) {
      pending = op != 'R';
    } else if (op == 'b') {
      out += '\x86';  // BUILD(obj, state) -> the pair (obj, state); unwrapped by the caller
    } else {
      TORCH_CHECK(!pending, "unsupported use of collections.OrderedDict in the pickle");
      out += whole;
    }
    previous = op;
  }
  return out;
}

}  // namespace ampp::detail

namespace ampp::detail {

c10::IValue without_metadata(const c10::IValue& value) {
  if (value.isTuple()) {
    const auto& e = value.toTupleRef().elements();
    if (e.size() == 2 && e[0].isGenericDict() && e[1].isGenericDict() && e[1].toGenericDict().size() == 1 &&
        e[1].toGenericDict().contains("_metadata"))
      return without_metadata(e[0]);
    std::vector<c10::IValue> items;
    for (const auto& item : e) items.push_back(without_metadata(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (value.isGenericDict()) {
    auto dict = value.toGenericDict();
    for (auto it = dict.begin(); it != dict.end(); ++it) it->setValue(without_metadata(it->value()));
    return dict;
  }
  if (value.isList()) {
    auto list = value.toList();
    for (size_t i = 0; i < list.size(); ++i) list.set(i, without_metadata(list.get(i)));
    return list;
  }
  return value;
}

}  // namespace ampp::detail
