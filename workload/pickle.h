// A safe reader and a writer for the plain-data subset of Python's pickle format (protocols
// 2-5): None, bool, int (64-bit), float, str, bytes, list, tuple and dict, as PyTorch's memory
// snapshots contain them. The reader is a bounded stack machine that never executes code:
// GLOBAL, REDUCE, BUILD and every other opcode that names or calls Python objects is rejected.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/result.h"

namespace memsim {

// One pickle document: every value is a node of `nodes`, children are node indices, so shared
// (memoized) values and even self-referencing containers own nothing twice and never leak.
class PickleDoc {
 public:
  enum class Type : uint8_t { kNone, kBool, kInt, kFloat, kStr, kBytes, kList, kTuple, kDict };
  struct Node {
    Type type = Type::kNone;
    int64_t i = 0;  // kBool (0/1), kInt
    double f = 0;   // kFloat
    std::string s;  // kStr (UTF-8), kBytes
    // kList / kTuple: the items; kDict: key, value, key, value, ... in insertion order.
    std::vector<uint32_t> items;
  };
  using Ref = uint32_t;

  // Parses `data`. Errors name the byte offset and the opcode, and say what is allowed.
  static Result<PickleDoc> parse(std::string_view data);

  // Building (for the writer): returns the new node's index.
  Ref add(Node n);
  Ref add_none() { return add(Node{}); }
  Ref add_bool(bool v);
  Ref add_int(int64_t v);
  Ref add_float(double v);
  Ref add_str(std::string v);
  Ref add_list(Type type = Type::kList);  // kList, kTuple or kDict
  void append(Ref container, Ref item) { nodes_[container].items.push_back(item); }
  void set(Ref dict, Ref key, Ref value);
  void set_root(Ref r) { root_ = r; }

  // Protocol-4 bytes (no memo, no frames: every Python since 3.4 reads them). Shared nodes are
  // written once per reference; a cycle is an error.
  Result<std::string> serialize() const;

  Ref root() const { return root_; }
  const Node& node(Ref r) const { return nodes_[r]; }
  size_t size() const { return nodes_.size(); }

  // Dict lookup by string key (linear in the dict's size); nullopt if absent or not a dict.
  std::optional<Ref> get(Ref dict, std::string_view key) const;
  static const char* type_name(Type t);

 private:
  std::vector<Node> nodes_;
  Ref root_ = 0;
};

}  // namespace memsim
