// Pickle reader (a bounded stack machine over the plain-data opcodes) and protocol-4 writer.
//
// Opcode values and argument layouts follow Python's Lib/pickletools.py, the format's own
// documentation. Memory stays linear in the input: every opcode that creates a node consumes at
// least one byte, and memo lookups push references, not copies.
#include "workload/pickle.h"

#include <bit>
#include <cstring>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

namespace memsim {

namespace {

// The opcodes this reader accepts (pickletools names).
enum Op : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kNone = 'N',
  kBinFloat = 'G',
  kBinUnicode = 'X',
  kShortBinBytes = 'C',
  kBinBytes = 'B',
  kEmptyList = ']',
  kAppend = 'a',
  kAppends = 'e',
  kList = 'l',
  kEmptyTuple = ')',
  kTuple = 't',
  kEmptyDict = '}',
  kDict = 'd',
  kSetItem = 's',
  kSetItems = 'u',
  kBinGet = 'h',
  kLongBinGet = 'j',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kProto = 0x80,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kMemoize = 0x94,
  kFrame = 0x95,
};

// Opcodes that import, call or build Python objects, by name, for the error message.
const char* forbidden_name(uint8_t op) {
  switch (op) {
    case 'c':
      return "GLOBAL";
    case 0x93:
      return "STACK_GLOBAL";
    case 'R':
      return "REDUCE";
    case 'b':
      return "BUILD";
    case 'i':
      return "INST";
    case 'o':
      return "OBJ";
    case 0x81:
      return "NEWOBJ";
    case 0x92:
      return "NEWOBJ_EX";
    case 0x82:
      return "EXT1";
    case 0x83:
      return "EXT2";
    case 0x84:
      return "EXT4";
    case 'P':
      return "PERSID";
    case 'Q':
      return "BINPERSID";
    case 0x97:
      return "NEXT_BUFFER";
    case 0x98:
      return "READONLY_BUFFER";
    default:
      return nullptr;
  }
}

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  Result<PickleDoc> run();

 private:
  Error fail(const std::string& what) const {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("pickle byte {}: {}", op_pos_, what));
  }
  bool take(size_t n, const char** p) {
    if (data_.size() - pos_ < n) return false;
    *p = data_.data() + pos_;
    pos_ += n;
    return true;
  }
  template <class T>
  bool take_le(T* v) {  // little-endian unsigned/signed integer
    const char* p = nullptr;
    if (!take(sizeof(T), &p)) return false;
    std::make_unsigned_t<T> u = 0;
    for (size_t k = 0; k < sizeof(T); ++k)
      u |= static_cast<std::make_unsigned_t<T>>(static_cast<uint8_t>(p[k])) << (8 * k);
    *v = static_cast<T>(u);
    return true;
  }
  PickleDoc::Ref push_new(PickleDoc::Node n) {
    const PickleDoc::Ref r = doc_.add(std::move(n));
    stack_.push_back(r);
    return r;
  }
  Result<size_t> pop_mark() {
    if (marks_.empty()) return fail("no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    // Items below the MARK were popped since (POP, SETITEM, ...): no well-formed pickle does it.
    if (m > stack_.size()) return fail("MARK above the top of the stack (its items were popped)");
    return m;
  }
  Result<PickleDoc::Ref> top_container(PickleDoc::Type want, size_t below_top) {
    if (stack_.size() < below_top + 1) return fail("stack underflow");
    const PickleDoc::Ref r = stack_[stack_.size() - 1 - below_top];
    if (doc_.node(r).type != want)
      return fail(fmt::format("expected a {} on the stack, found a {}", PickleDoc::type_name(want),
                              PickleDoc::type_name(doc_.node(r).type)));
    return r;
  }
  Status string_op(size_t len, PickleDoc::Type type);
  Status long_op(size_t nbytes);
  Status step(uint8_t op);
  std::optional<Status> control_op(uint8_t op);
  std::optional<Status> scalar_op(uint8_t op);
  std::optional<Status> container_op(uint8_t op);
  std::optional<Status> memo_op(uint8_t op);

  std::string_view data_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  PickleDoc doc_;
  std::vector<PickleDoc::Ref> stack_;
  std::vector<size_t> marks_;  // stack heights at each MARK
  std::unordered_map<uint32_t, PickleDoc::Ref> memo_;
  bool stopped_ = false;
};

Status Reader::string_op(size_t len, PickleDoc::Type type) {
  const char* p = nullptr;
  if (!take(len, &p)) return fail(fmt::format("string of {} bytes runs past the end", len));
  PickleDoc::Node n;
  n.type = type;
  n.s.assign(p, len);
  push_new(std::move(n));
  return {};
}

// LONG1/LONG4: little-endian two's complement of `nbytes` bytes; memsim keeps 64 bits.
Status Reader::long_op(size_t nbytes) {
  const char* p = nullptr;
  if (!take(nbytes, &p)) return fail("integer runs past the end");
  if (nbytes > 8) return fail(fmt::format("integer of {} bytes is wider than 64 bits", nbytes));
  uint64_t u = 0;
  for (size_t k = 0; k < nbytes; ++k) u |= uint64_t{static_cast<uint8_t>(p[k])} << (8 * k);
  if (nbytes > 0 && nbytes < 8 && (static_cast<uint8_t>(p[nbytes - 1]) & 0x80) != 0)
    u |= ~uint64_t{0} << (8 * nbytes);  // sign-extend
  PickleDoc::Node n;
  n.type = PickleDoc::Type::kInt;
  n.i = static_cast<int64_t>(u);
  push_new(std::move(n));
  return {};
}

// PROTO, FRAME, STOP and the stack opcodes (MARK, POP, POP_MARK, DUP); nullopt when `op` is not one
// of them.
std::optional<Status> Reader::control_op(uint8_t op) {
  switch (op) {
    case kProto: {
      uint8_t v = 0;
      if (!take_le(&v)) return fail("PROTO without a version");
      if (v < 2 || v > 5) return fail(fmt::format("pickle protocol {} (memsim reads 2 to 5)", v));
      return Status{};
    }
    case kFrame: {
      uint64_t len = 0;
      if (!take_le(&len)) return fail("FRAME without a length");
      return Status{};  // frames only group bytes; the opcodes inside are read as usual
    }
    case kStop:
      stopped_ = true;
      return Status{};
    case kMark:
      marks_.push_back(stack_.size());
      return Status{};
    case kPop:
      if (stack_.empty()) return fail("POP on an empty stack");
      stack_.pop_back();
      return Status{};
    case kPopMark: {
      MEMSIM_ASSIGN_OR_RETURN(const size_t m, pop_mark());
      stack_.resize(m);
      return Status{};
    }
    case kDup:
      if (stack_.empty()) return fail("DUP on an empty stack");
      stack_.push_back(stack_.back());
      return Status{};
    default:
      return std::nullopt;
  }
}

// None, bools, ints, floats, strings and bytes; nullopt when `op` is not one of them.
std::optional<Status> Reader::scalar_op(uint8_t op) {
  using T = PickleDoc::Type;
  switch (op) {
    case kNone:
      push_new({});
      return Status{};
    case kNewTrue:
    case kNewFalse: {
      PickleDoc::Node n;
      n.type = T::kBool;
      n.i = op == kNewTrue ? 1 : 0;
      push_new(std::move(n));
      return Status{};
    }
    case kBinInt1:
    case kBinInt2:
    case kBinInt: {
      int64_t v = 0;
      bool ok = false;
      if (op == kBinInt1) {
        uint8_t u = 0;
        ok = take_le(&u);
        v = u;
      } else if (op == kBinInt2) {
        uint16_t u = 0;
        ok = take_le(&u);
        v = u;
      } else {
        int32_t s = 0;
        ok = take_le(&s);
        v = s;
      }
      if (!ok) return fail("integer runs past the end");
      PickleDoc::Node n;
      n.type = T::kInt;
      n.i = v;
      push_new(std::move(n));
      return Status{};
    }
    case kLong1: {
      uint8_t n = 0;
      if (!take_le(&n)) return fail("LONG1 without a length");
      return long_op(n);
    }
    case kLong4: {
      int32_t n = 0;
      if (!take_le(&n) || n < 0) return fail("LONG4 without a valid length");
      return long_op(static_cast<size_t>(n));
    }
    case kBinFloat: {
      uint64_t be = 0;
      const char* p = nullptr;
      if (!take(8, &p)) return fail("BINFLOAT runs past the end");
      for (int k = 0; k < 8; ++k) be = (be << 8) | static_cast<uint8_t>(p[k]);  // big-endian
      PickleDoc::Node n;
      n.type = T::kFloat;
      n.f = std::bit_cast<double>(be);
      push_new(std::move(n));
      return Status{};
    }
    case kShortBinUnicode:
    case kShortBinBytes: {
      uint8_t len = 0;
      if (!take_le(&len)) return fail("string without a length");
      return string_op(len, op == kShortBinUnicode ? T::kStr : T::kBytes);
    }
    case kBinUnicode:
    case kBinBytes: {
      uint32_t len = 0;
      if (!take_le(&len)) return fail("string without a length");
      return string_op(len, op == kBinUnicode ? T::kStr : T::kBytes);
    }
    case kBinUnicode8:
    case kBinBytes8: {
      uint64_t len = 0;
      if (!take_le(&len)) return fail("string without a length");
      return string_op(len, op == kBinUnicode8 ? T::kStr : T::kBytes);
    }
    default:
      return std::nullopt;
  }
}

// Tuples, lists and dicts: made empty or from the stack, and filled; nullopt when `op` is not one
// of them.
std::optional<Status> Reader::container_op(uint8_t op) {
  using T = PickleDoc::Type;
  switch (op) {
    case kEmptyList:
    case kEmptyTuple:
    case kEmptyDict: {
      PickleDoc::Node n;
      n.type = op == kEmptyList ? T::kList : op == kEmptyTuple ? T::kTuple : T::kDict;
      push_new(std::move(n));
      return Status{};
    }
    case kTuple1:
    case kTuple2:
    case kTuple3: {
      const size_t k = op - kTuple1 + 1;
      if (stack_.size() < k) return fail("TUPLE with too few items on the stack");
      PickleDoc::Node n;
      n.type = T::kTuple;
      n.items.assign(stack_.end() - static_cast<std::ptrdiff_t>(k), stack_.end());
      stack_.resize(stack_.size() - k);
      push_new(std::move(n));
      return Status{};
    }
    case kTuple:
    case kList:
    case kDict: {
      MEMSIM_ASSIGN_OR_RETURN(const size_t m, pop_mark());
      PickleDoc::Node n;
      n.type = op == kTuple ? T::kTuple : op == kList ? T::kList : T::kDict;
      if (op == kDict && (stack_.size() - m) % 2 != 0) return fail("DICT with an odd item count");
      n.items.assign(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
      stack_.resize(m);
      push_new(std::move(n));
      return Status{};
    }
    case kAppend: {
      MEMSIM_ASSIGN_OR_RETURN(const PickleDoc::Ref list, top_container(T::kList, 1));
      doc_.append(list, stack_.back());
      stack_.pop_back();
      return Status{};
    }
    case kSetItem: {
      MEMSIM_ASSIGN_OR_RETURN(const PickleDoc::Ref dict, top_container(T::kDict, 2));
      doc_.append(dict, stack_[stack_.size() - 2]);
      doc_.append(dict, stack_.back());
      stack_.resize(stack_.size() - 2);
      return Status{};
    }
    case kAppends:
    case kSetItems: {
      MEMSIM_ASSIGN_OR_RETURN(const size_t m, pop_mark());
      if (m == 0) return fail("APPENDS/SETITEMS with no container below the MARK");
      const PickleDoc::Ref c = stack_[m - 1];
      const T want = op == kAppends ? T::kList : T::kDict;
      if (doc_.node(c).type != want)
        return fail(fmt::format("expected a {} below the MARK, found a {}",
                                PickleDoc::type_name(want),
                                PickleDoc::type_name(doc_.node(c).type)));
      if (op == kSetItems && (stack_.size() - m) % 2 != 0)
        return fail("SETITEMS with an odd item count");
      for (size_t k = m; k < stack_.size(); ++k) doc_.append(c, stack_[k]);
      stack_.resize(m);
      return Status{};
    }
    default:
      return std::nullopt;
  }
}

// The memo: MEMOIZE, PUT and GET; nullopt when `op` is not one of them.
std::optional<Status> Reader::memo_op(uint8_t op) {
  switch (op) {
    case kMemoize:
      if (stack_.empty()) return fail("MEMOIZE on an empty stack");
      memo_[static_cast<uint32_t>(memo_.size())] = stack_.back();
      return Status{};
    case kBinPut:
    case kLongBinPut: {
      uint32_t idx = 0;
      bool ok = false;
      if (op == kBinPut) {
        uint8_t u = 0;
        ok = take_le(&u);
        idx = u;
      } else {
        ok = take_le(&idx);
      }
      if (!ok) return fail("PUT without an index");
      if (stack_.empty()) return fail("PUT on an empty stack");
      memo_[idx] = stack_.back();
      return Status{};
    }
    case kBinGet:
    case kLongBinGet: {
      uint32_t idx = 0;
      bool ok = false;
      if (op == kBinGet) {
        uint8_t u = 0;
        ok = take_le(&u);
        idx = u;
      } else {
        ok = take_le(&idx);
      }
      if (!ok) return fail("GET without an index");
      auto it = memo_.find(idx);
      if (it == memo_.end()) return fail(fmt::format("GET of memo entry {} never stored", idx));
      stack_.push_back(it->second);
      return Status{};
    }
    default:
      return std::nullopt;
  }
}

Status Reader::step(uint8_t op) {
  for (auto group :
       {&Reader::control_op, &Reader::scalar_op, &Reader::container_op, &Reader::memo_op})
    if (std::optional<Status> done = (this->*group)(op)) return std::move(*done);
  if (const char* name = forbidden_name(op))
    return fail(
        fmt::format("opcode {} names or calls Python objects; a memory snapshot holds "
                    "only plain data, and memsim never executes code from a pickle",
                    name));
  return fail(
      fmt::format("opcode 0x{:02x} is not one memsim reads (protocol 2-5 plain data: "
                  "None, bool, int, float, str, bytes, list, tuple, dict)",
                  op));
}

Result<PickleDoc> Reader::run() {
  if (data_.empty()) return make_error(ErrorCode::kInvalidArgument, "empty file, not a pickle");
  if (static_cast<uint8_t>(data_[0]) != kProto)
    return make_error(ErrorCode::kInvalidArgument,
                      "not a binary pickle (it does not start with the PROTO opcode)");
  while (!stopped_) {
    if (pos_ >= data_.size()) {
      op_pos_ = pos_;
      return fail("truncated: the data ends before the STOP opcode");
    }
    op_pos_ = pos_;
    const auto op = static_cast<uint8_t>(data_[pos_++]);
    MEMSIM_TRY(step(op));
  }
  if (stack_.size() != 1 || !marks_.empty())
    return fail(fmt::format("STOP with {} values and {} marks on the stack (want 1 and 0)",
                            stack_.size(), marks_.size()));
  doc_.set_root(stack_.back());
  return std::move(doc_);
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int k = 0; k < bytes; ++k) out.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

}  // namespace

Result<PickleDoc> PickleDoc::parse(std::string_view data) {
  return Reader(data).run();
}

PickleDoc::Ref PickleDoc::add(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<Ref>(nodes_.size() - 1);
}

PickleDoc::Ref PickleDoc::add_bool(bool v) {
  Node n;
  n.type = Type::kBool;
  n.i = v ? 1 : 0;
  return add(std::move(n));
}

PickleDoc::Ref PickleDoc::add_int(int64_t v) {
  Node n;
  n.type = Type::kInt;
  n.i = v;
  return add(std::move(n));
}

PickleDoc::Ref PickleDoc::add_float(double v) {
  Node n;
  n.type = Type::kFloat;
  n.f = v;
  return add(std::move(n));
}

PickleDoc::Ref PickleDoc::add_str(std::string v) {
  Node n;
  n.type = Type::kStr;
  n.s = std::move(v);
  return add(std::move(n));
}

PickleDoc::Ref PickleDoc::add_list(Type type) {
  Node n;
  n.type = type;
  return add(std::move(n));
}

void PickleDoc::set(Ref dict, Ref key, Ref value) {
  nodes_[dict].items.push_back(key);
  nodes_[dict].items.push_back(value);
}

// Python dicts keep the last value stored under a key; so does this lookup.
std::optional<PickleDoc::Ref> PickleDoc::get(Ref dict, std::string_view key) const {
  const Node& d = nodes_[dict];
  if (d.type != Type::kDict) return std::nullopt;
  std::optional<Ref> found;
  for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
    const Node& kn = nodes_[d.items[k]];
    if (kn.type == Type::kStr && kn.s == key) found = d.items[k + 1];
  }
  return found;
}

const char* PickleDoc::type_name(Type t) {
  switch (t) {
    case Type::kNone:
      return "None";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kStr:
      return "str";
    case Type::kBytes:
      return "bytes";
    case Type::kList:
      return "list";
    case Type::kTuple:
      return "tuple";
    case Type::kDict:
      return "dict";
  }
  return "?";
}

Result<std::string> PickleDoc::serialize() const {
  if (nodes_.empty()) return make_error(ErrorCode::kInvalidState, "empty pickle document");
  std::string out;
  out.push_back(static_cast<char>(kProto));
  out.push_back(4);
  constexpr int kMaxDepth = 1000;
  // Explicit stack of (node, next child index) so deep documents cannot overflow the C++ stack.
  struct Frame {
    Ref node;
    size_t next;
  };
  std::vector<Frame> todo;
  auto open = [&](Ref r) -> Status {
    if (todo.size() >= kMaxDepth)
      return make_error(ErrorCode::kInvalidState, "pickle document nested too deep or cyclic");
    const Node& n = nodes_[r];
    switch (n.type) {
      case Type::kNone:
        out.push_back(kNone);
        return {};
      case Type::kBool:
        out.push_back(static_cast<char>(n.i != 0 ? kNewTrue : kNewFalse));
        return {};
      case Type::kInt:
        if (n.i >= 0 && n.i < 256) {
          out.push_back(kBinInt1);
          put_le(out, static_cast<uint64_t>(n.i), 1);
        } else if (n.i >= 0 && n.i < 65536) {
          out.push_back(kBinInt2);
          put_le(out, static_cast<uint64_t>(n.i), 2);
        } else if (n.i >= INT32_MIN && n.i <= INT32_MAX) {
          out.push_back(kBinInt);
          put_le(out, static_cast<uint64_t>(n.i), 4);
        } else {  // LONG1: the fewest bytes whose two's complement holds the value
          int bytes = 1;
          while (bytes < 8) {
            const int64_t lo = -(int64_t{1} << (8 * bytes - 1));
            const int64_t hi = (int64_t{1} << (8 * bytes - 1)) - 1;
            if (n.i >= lo && n.i <= hi) break;
            ++bytes;
          }
          out.push_back(static_cast<char>(kLong1));
          out.push_back(static_cast<char>(bytes));
          put_le(out, static_cast<uint64_t>(n.i), bytes);
        }
        return {};
      case Type::kFloat: {
        out.push_back(kBinFloat);
        const auto u = std::bit_cast<uint64_t>(n.f);
        for (int k = 7; k >= 0; --k) out.push_back(static_cast<char>((u >> (8 * k)) & 0xff));
        return {};
      }
      case Type::kStr:
      case Type::kBytes: {
        const bool str = n.type == Type::kStr;
        if (n.s.size() < 256) {
          out.push_back(static_cast<char>(str ? kShortBinUnicode : kShortBinBytes));
          put_le(out, n.s.size(), 1);
        } else if (n.s.size() <= UINT32_MAX) {
          out.push_back(str ? kBinUnicode : kBinBytes);
          put_le(out, n.s.size(), 4);
        } else {
          out.push_back(static_cast<char>(str ? kBinUnicode8 : kBinBytes8));
          put_le(out, n.s.size(), 8);
        }
        out += n.s;
        return {};
      }
      case Type::kList:
        out.push_back(kEmptyList);
        break;
      case Type::kDict:
        out.push_back(kEmptyDict);
        break;
      case Type::kTuple:
        if (n.items.empty()) {
          out.push_back(kEmptyTuple);
          return {};
        }
        break;
    }
    out.push_back(kMark);
    todo.push_back(Frame{r, 0});
    return {};
  };
  MEMSIM_TRY(open(root_));
  while (!todo.empty()) {
    Frame& f = todo.back();
    const Node& n = nodes_[f.node];
    if (f.next < n.items.size()) {
      const Ref child = n.items[f.next++];
      MEMSIM_TRY(open(child));
      continue;
    }
    out.push_back(n.type == Type::kList ? kAppends : n.type == Type::kDict ? kSetItems : kTuple);
    todo.pop_back();
  }
  out.push_back(kStop);
  return out;
}

}  // namespace memsim
