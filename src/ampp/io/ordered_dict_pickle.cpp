// Pickle opcodes are walked by their argument lengths (pickle_guard.h), so the rewrite never mistakes
// data bytes for opcodes. The pickle has passed check_pickle() first.
#include "ordered_dict_pickle.h"
#include "pickle_guard.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

namespace ampp::detail {

namespace {

// Where each object on the unpickler's stack begins in the output, and where each MARK is: enough to
// find the start of a SETITEM's key. Only the stack effect of each opcode is modelled, not values.
class StackModel {
 public:
  void apply(char op, size_t start) {
    switch (op) {
      case 'q':
      case 'r':
      case 'p':
      case '\x80':
      case '.':
        return;  // memo puts, PROTO, STOP
      case '(':
        marks_.push_back({starts_.size(), start});
        return;
      case 't':
      case 'l':
      case 'd':
      case 'o':
      case 'i':
        starts_.push_back(pop_mark());
        return;
      case 'u':
      case 'e':
      case '1':
        pop_mark();
        return;
      case 'a':
      case 'b':
      case '0':
        pop();
        return;
      case 's':
        pop(), pop();
        return;
      case '\x85':
      case 'Q':
        starts_.push_back(pop());
        return;
      case '\x86':
      case 'R':
      case '\x81':
        pop();
        starts_.push_back(pop());
        return;
      case '\x87':
        pop(), pop();
        starts_.push_back(pop());
        return;
      case '2':
        starts_.push_back(top(0));
        return;
      default:
        starts_.push_back(start);
        return;  // every other opcode pushes one object
    }
  }
  size_t top(size_t below) const {
    TORCH_CHECK(starts_.size() > below, "malformed pickle: stack underflow");
    return starts_[starts_.size() - 1 - below];
  }

 private:
  size_t pop() {
    const size_t start = top(0);
    starts_.pop_back();
    return start;
  }
  size_t pop_mark() {
    TORCH_CHECK(!marks_.empty(), "malformed pickle: no MARK");
    const auto [depth, start] = marks_.back();
    marks_.pop_back();
    starts_.resize(depth);
    return start;
  }
  std::vector<size_t> starts_;
  std::vector<std::pair<size_t, size_t>> marks_;  // (stack depth, output offset)
};

class Rewriter {
 public:
  std::string run(const std::string& p) {
    size_t at = 0;
    while (at < p.size()) {
      const char op = p[at];
      const size_t n = pickle_argument_length(op, p, at + 1);
      step(op, p.substr(at, 1 + n));
      at += 1 + n;
      previous_ = op;
    }
    return std::move(out_);
  }

 private:
  void emit(const std::string& bytes) {
    const size_t start = out_.size();
    out_ += bytes;
    stack_.apply(bytes[0], start);
  }
  void step(char op, const std::string& whole) {
    static const std::string kOrderedDict = "collections\nOrderedDict\n";
    const bool is_get = op == 'h' || op == 'j', is_put = op == 'q' || op == 'r';
    if ((op == 'c' && whole.compare(1, std::string::npos, kOrderedDict) == 0) ||
        (is_get && ordered_dict_memo_.count(pickle_memo_index(op, whole, 1)))) {
      emit("}"), pending_ = true;  // the class becomes the empty dict the call would have made
    } else if (is_put && pending_ && previous_ == 'c') {
      ordered_dict_memo_.insert(pickle_memo_index(op, whole, 1));  // the memo keeps its numbering
      emit(whole);
    } else if (pending_ && (op == ')' || op == 'R')) {
      pending_ = op != 'R';
    } else if (op == 'b') {
      emit("\x86");  // BUILD(obj, state) -> the pair (obj, state); unwrapped by without_metadata()
    } else if (op == 's' || op == 'a') {
      // SETITEM(dict, key, value) -> SETITEMS(dict, MARK, key, value), APPEND(list, x) -> APPENDS(list,
      // MARK, x): LibTorch 1.13's unpickler has neither single-item form (Python writes them for one item).
      out_.insert(stack_.top(op == 's' ? 1 : 0), 1, '(');
      out_ += op == 's' ? 'u' : 'e';
      stack_.apply(op, 0);
    } else {
      TORCH_CHECK(!pending_, "unsupported use of collections.OrderedDict in the pickle");
      emit(whole);
    }
  }

  std::string out_;
  StackModel stack_;
  std::set<uint32_t> ordered_dict_memo_;  // memo slots holding the OrderedDict class
  char previous_ = 0;
  bool pending_ = false;  // an OrderedDict() call is being replaced: drop its EMPTY_TUPLE and REDUCE
};

}  // namespace

std::string plain_dicts(const std::string& p) { return Rewriter().run(p); }

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
