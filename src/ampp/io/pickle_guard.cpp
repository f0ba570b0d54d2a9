// The opcode walk of check_pickle() (pickle_guard.h). Opcodes and their argument lengths as Python's
// pickletools documents them; only the stack effect and nesting of each opcode is modelled, not values.
#include "pickle_guard.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace ampp::detail {

uint32_t pickle_u32(const std::string& p, size_t at) {
  TORCH_CHECK(at <= p.size() && p.size() - at >= 4, "truncated pickle at byte ", at);
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[at + i]);
  return v;
}

size_t pickle_argument_length(char op, const std::string& p, size_t at) {
  auto line = [&](size_t from) {
    const size_t end = from <= p.size() ? p.find('\n', from) : std::string::npos;
    TORCH_CHECK(end != std::string::npos, "truncated pickle at byte ", from);
    return end + 1 - from;
  };
  switch (op) {
    case 'K':
    case 'h':
    case 'q':
    case '\x80':
      return 1;  // BININT1 BINGET BINPUT PROTO
    case 'M':
      return 2;  // BININT2
    case 'J':
    case 'j':
    case 'r':
      return 4;  // BININT LONG_BINGET LONG_BINPUT
    case 'G':
      return 8;  // BINFLOAT
    case 'U':
    case 'C':
    case '\x8a':  // SHORT_BINSTRING SHORT_BINBYTES LONG1
      TORCH_CHECK(at < p.size(), "truncated pickle at byte ", at);
      return 1 + static_cast<uint8_t>(p[at]);
    case 'T':
    case 'X':
    case 'B':
    case '\x8b':  // BINSTRING BINUNICODE BINBYTES LONG4
      return 4 + static_cast<size_t>(pickle_u32(p, at));
    case 'c': {  // GLOBAL module\nname\n
      const size_t first = line(at);
      return first + line(at + first);
    }
    default:
      TORCH_CHECK(op != '\0' && std::strchr("(.N])}ltdeausRbQ\x81\x85\x86\x87\x88\x89"
                                            "012",
                                            op) != nullptr,
                  "unsupported pickle opcode 0x", std::hex, static_cast<int>(static_cast<uint8_t>(op)), std::dec,
                  " at byte ", at - 1, " (torch.save writes binary protocol 2)");
      return 0;
  }
}

uint32_t pickle_memo_index(char op, const std::string& p, size_t at) {
  return op == 'q' || op == 'h' ? static_cast<uint8_t>(p[at]) : pickle_u32(p, at);
}

namespace {

// What a tensor state dict (torch.save of state_dict(), optimizer and scaler dicts) needs.
bool allowed_global(const std::string& module, const std::string& name) {
  static const std::set<std::string> kStorages = {
      "FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage", "LongStorage",         "IntStorage",
      "ShortStorage", "CharStorage",   "ByteStorage", "BoolStorage",     "ComplexFloatStorage", "ComplexDoubleStorage"};
  static const std::set<std::string> kTypedLists = {"build_intlist", "build_doublelist", "build_boollist",
                                                    "build_tensorlist"};
  return (module == "collections" && name == "OrderedDict") ||
         (module == "torch._utils" && name == "_rebuild_tensor_v2") || (module == "torch" && kStorages.count(name)) ||
         (module == "torch.jit._pickle" && kTypedLists.count(name));
}

// An archive's module classes: "__torch__" or "__torch__.___torch_mangle_<digits>", class "Module", the
// names torch::serialize::OutputArchive gives them. Their declarations (code/) are never compiled.
bool archive_class(const std::string& module, const std::string& name) {
  const std::string mangled = "__torch__.___torch_mangle_";
  if (name != "Module") return false;
  if (module == "__torch__") return true;
  return module.size() > mangled.size() && module.size() <= mangled.size() + 9 &&
         module.compare(0, mangled.size(), mangled) == 0 &&
         std::all_of(module.begin() + static_cast<std::ptrdiff_t>(mangled.size()), module.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

class PickleWalk {
 public:
  PickleWalk(const std::string& p, PickleSource source) : p_(p), source_(source) {}

  StorageLocations run() {
    size_t at = 0;
    bool stopped = false;
    while (at < p_.size()) {
      TORCH_CHECK(!stopped, "unexpected bytes after the pickle's STOP at byte ", at);
      const char op = p_[at];
      const size_t n = pickle_argument_length(op, p_, at + 1);
      TORCH_CHECK(n <= p_.size() - at - 1, "truncated pickle: the argument of the opcode at byte ", at,
                  " runs past the end");
      at_ = at;
      stopped = op == '.';
      apply(op, at + 1, n);
      at += 1 + n;
    }
    TORCH_CHECK(stopped, "truncated pickle: no STOP opcode");
    return locations_;
  }

 private:
  struct Object {
    size_t depth = 0;           // 0: a scalar; 1: an empty container
    bool sealed = false;        // nested inside another object: may no longer change
    std::string text;           // a string's value (BINUNICODE), to read storage locations
    std::vector<size_t> items;  // a tuple's items, for the same reason
  };

  void apply(char op, size_t arg, size_t n) {
    switch (op) {
      case '\x80':
      case '.':
        return;  // PROTO STOP
      case '(':
        marks_.push_back(stack_.size());
        return;
      case ']':
      case '}':
      case ')':
        push(new_object(1));
        return;
      case 'l':
      case 'd':
        push(container_of(pop_to_mark()));
        return;
      case 't':
        push(tuple_of(pop_to_mark()));
        return;
      case '\x85':
      case '\x86':
      case '\x87':
        push(tuple_of(pop_n(op - '\x84')));
        return;  // TUPLE1-3
      case 'a':
      case 's':
      case 'e':
      case 'u':
        fill(op);
        return;
      case 'R':
      case '\x81':
      case 'b':
        call(op);
        return;
      case 'Q':
        note_location(pop());
        push(new_object(0));
        return;  // BINPERSID: a storage
      case 'X':
        push(new_object(0));
        objects_.back().text = p_.substr(arg + 4, n - 4);
        return;  // BINUNICODE
      case '0':
        pop();
        return;
      case '1':
        pop_to_mark();
        return;
      case '2':
        push(top());
        return;
      case 'q':
      case 'r':
        put(pickle_memo_index(op, p_, arg));
        return;
      case 'h':
      case 'j':
        get(pickle_memo_index(op, p_, arg));
        return;
      case 'c':
        global(p_.substr(arg, n));
        return;
      default:
        push(new_object(0));
        return;  // every other accepted opcode pushes a scalar
    }
  }

  size_t new_object(size_t depth) {
    objects_.push_back({depth, false, {}, {}});
    return objects_.size() - 1;
  }
  void push(size_t id) { stack_.push_back(id); }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  size_t top() const {
    TORCH_CHECK(stack_.size() > floor(), "malformed pickle: stack underflow at byte ", at_);
    return stack_.back();
  }
  size_t pop() {
    const size_t id = top();
    stack_.pop_back();
    return id;
  }
  std::vector<size_t> pop_n(size_t n) {
    TORCH_CHECK(stack_.size() >= floor() + n, "malformed pickle: stack underflow at byte ", at_);
    std::vector<size_t> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return items;
  }
  std::vector<size_t> pop_to_mark() {
    TORCH_CHECK(!marks_.empty(), "malformed pickle: no MARK before the opcode at byte ", at_);
    std::vector<size_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }

  // `item` becomes part of `into`: sealed, and `into` at least one level deeper.
  void nest(size_t item, size_t into) {
    TORCH_CHECK(item != into, "malformed pickle: an object contains itself (byte ", at_, ")");
    objects_[item].sealed = true;
    const size_t depth = std::max(objects_[into].depth, objects_[item].depth + 1);
    TORCH_CHECK(depth <= kMaxPickleDepth, "the pickle nests objects deeper than ", kMaxPickleDepth, " levels (byte ",
                at_, "); a checkpoint's state dicts are a few levels deep");
    objects_[into].depth = depth;
  }
  size_t container_of(const std::vector<size_t>& items) {
    const size_t id = new_object(1);
    for (size_t item : items) nest(item, id);
    return id;
  }
  size_t tuple_of(const std::vector<size_t>& items) {
    const size_t id = container_of(items);
    objects_[id].items = items;
    return id;
  }
  // A persistent id ("storage", type, key, location, numel): where the storage of record data/<key> was.
  void note_location(size_t id) {
    const auto& items = objects_[id].items;
    if (items.size() != 5 || objects_[items[0]].text != "storage") return;
    const std::string& key = objects_[items[2]].text;
    const std::string& location = objects_[items[3]].text;
    const auto [it, added] = locations_.emplace(key, location);
    TORCH_CHECK(added || it->second == location, "the pickle places storage '", key, "' both on ", it->second,
                " and on ", location, " (byte ", at_, ")");
  }
  void add_to(size_t container, const std::vector<size_t>& items) {
    TORCH_CHECK(!objects_[container].sealed, "malformed pickle: a container is changed after it was nested (byte ", at_,
                ")");
    for (size_t item : items) nest(item, container);
  }
  void fill(char op) {  // APPEND SETITEM APPENDS SETITEMS
    const auto items = op == 'a' ? pop_n(1) : op == 's' ? pop_n(2) : pop_to_mark();
    TORCH_CHECK(op != 'u' || items.size() % 2 == 0, "malformed pickle: SETITEMS with an odd count at byte ", at_);
    add_to(top(), items);  // the container stays on the stack
  }
  void call(char op) {  // REDUCE NEWOBJ BUILD: the result is one level above its arguments
    const size_t argument = pop();
    if (op == 'b') return add_to(top(), {argument});
    pop();  // the callable or class
    push(container_of({argument}));
  }
  void put(uint32_t index) {
    TORCH_CHECK(index == memo_.size(), "malformed pickle: memo index ", index, " at byte ", at_,
                " is out of order (expected ", memo_.size(), ")");
    memo_.push_back(top());
  }
  void get(uint32_t index) {
    TORCH_CHECK(index < memo_.size(), "malformed pickle: memo index ", index, " at byte ", at_, " was never stored");
    push(memo_[index]);
  }
  void global(const std::string& argument) {
    const size_t newline = argument.find('\n');
    const std::string module = argument.substr(0, newline);
    const std::string name = argument.substr(newline + 1, argument.size() - newline - 2);
    const bool archive_global =
        source_ == PickleSource::kArchive &&
        (archive_class(module, name) || (module == "torch.jit._pickle" && name == "restore_type_tag"));
    TORCH_CHECK(allowed_global(module, name) || archive_global, "the pickle calls ", module, ".", name,
                ", which ampp does not load: only tensors, numbers, strings, lists, tuples and dicts (save "
                "state_dict()s, as torch.save(model.state_dict(), path) does)");
    push(new_object(0));
  }

  const std::string& p_;
  const PickleSource source_;
  size_t at_ = 0;  // the current opcode's offset, for errors
  std::vector<Object> objects_;
  std::vector<size_t> stack_, marks_, memo_;
  StorageLocations locations_;
};

}  // namespace

StorageLocations check_pickle(const std::string& pickle, PickleSource source) {
  return PickleWalk(pickle, source).run();
}

}  // namespace ampp::detail
