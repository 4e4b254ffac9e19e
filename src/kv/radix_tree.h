// RadixTree: SGLang's radix tree over token ids, edges of whole KV pages, lock references and
// an ordered set of evictable leaves (LRU or LFU), for radix_token_pool.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/kv/token_content.h"

namespace memsim {

// A node's edge covers token positions [depth, end) of every sequence through it and holds one
// page id per page_size tokens of it. Nodes are indices into a vector (the root is 0); children
// are found by (parent, hash of the edge's first page), which TokenContent computes from runs,
// so a lookup step costs O(log runs) however long the prompt. lock_ref counts the live
// sequences whose path ends at or below the node; a node is evictable when its lock_ref is 0,
// and an evictable node without children is an evictable leaf, ordered for eviction by
// (last access, id) (LRU) or (hits, last access, id) (LFU). Time is a logical counter advanced
// by begin_op(), so runs are deterministic.
class RadixTree {
 public:
  static constexpr uint32_t kRoot = 0;
  enum class Policy : uint8_t { kLru, kLfu };

  RadixTree(uint32_t page_size, Policy policy);
  void clear();

  // Result of a side-effect-free walk: `tokens` matched (a multiple of page_size); the match
  // ends `into` tokens into the edge of `node` (into == the edge's length: at its end; the root:
  // 0); `unlocked_pages` are pages of nodes with lock_ref 0 on the matched part of the path.
  struct Match {
    uint32_t tokens = 0;
    uint32_t node = kRoot;
    uint32_t into = 0;
    uint64_t unlocked_pages = 0;
  };
  Match match(const TokenContent& content, uint32_t limit) const;

  // Starts an operation: later touches carry a new access time.
  void begin_op() { ++now_; }
  // Walks [0, limit) as match() does, setting the access time of every node it passes (and
  // counting a hit on each when count_hits), and splits the last edge where the match ends
  // inside it (SGLang _split_node). Returns the deepest node, whose end is the matched length.
  // `blocked` is set when a child with the next page's hash exists but holds other tokens (a
  // 64-bit hash collision): nothing may be added below the node for this content.
  struct Descent {
    uint32_t node = kRoot;
    uint32_t tokens = 0;
    bool blocked = false;
  };
  Descent descend(const TokenContent& content, uint32_t limit, bool count_hits);
  // Adds a leaf below `parent` (not blocked for `content`) for tokens [end_of(parent), end) of
  // `content`, holding `pages` (one per page); it starts unlocked, i.e. evictable.
  uint32_t add_leaf(uint32_t parent, const TokenContent& content, uint32_t end,
                    std::vector<uint32_t> pages);

  // inc_lock_ref / dec_lock_ref on the path from `node` up to the root.
  void lock(uint32_t node);
  void unlock(uint32_t node);

  // Evicts whole evictable leaves, lowest priority first, until at least `pages` pages are
  // freed or nothing is evictable; appends the freed page ids to `out`.
  uint64_t evict(uint64_t pages, std::vector<uint32_t>* out);

  uint32_t page_size() const { return page_size_; }
  uint32_t end_of(uint32_t node) const { return nodes_[node].depth + edge_tokens(node); }
  uint64_t evictable_pages() const { return evictable_pages_; }
  uint64_t protected_pages() const { return protected_pages_; }
  uint64_t node_count() const { return nodes_.size() - free_nodes_.size(); }
  uint32_t lock_ref(uint32_t node) const { return nodes_[node].lock_ref; }
  const std::vector<uint32_t>& pages_of(uint32_t node) const { return nodes_[node].pages; }
  uint32_t parent_of(uint32_t node) const { return nodes_[node].parent; }
  uint32_t capacity() const { return static_cast<uint32_t>(nodes_.size()); }  // node ids < this
  bool is_live(uint32_t node) const { return node < nodes_.size() && nodes_[node].live; }
  // The next leaf eviction would take (kRoot when none); for tests.
  uint32_t next_victim() const { return leaves_.empty() ? kRoot : leaves_.begin()->id; }

  // Verifies structure, keys, counters and the leaf set; `expected_locks(node)` gives the lock
  // count the owner's sequences imply. Calls `page(id)` for every page the tree holds.
  bool check(std::string* why, const std::function<uint32_t(uint32_t)>& expected_locks,
             const std::function<void(uint32_t)>& page) const;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct LeafKey {
    uint64_t first = 0;
    uint64_t second = 0;
    uint32_t id = 0;
    friend auto operator<=>(const LeafKey&, const LeafKey&) = default;
  };
  struct Node {
    uint32_t parent = kNone;
    uint32_t depth = 0;  // first token position of the edge
    uint32_t lock_ref = 0;
    uint32_t children = 0;
    uint64_t edge_key = 0;  // hash of the edge's first page: the key in the parent's children
    uint64_t last_access = 0;
    uint64_t hits = 0;
    TokenContent key;             // tokens [depth, depth + edge length)
    std::vector<uint32_t> pages;  // one page id per page_size tokens of the edge
    LeafKey filed;                // its key in the leaf set while in_leaves
    bool live = false;
    bool in_leaves = false;
  };
  struct ChildKey {
    uint32_t parent;
    uint64_t edge;
    friend bool operator==(const ChildKey&, const ChildKey&) = default;
  };
  struct ChildHash {
    size_t operator()(const ChildKey& k) const {
      return static_cast<size_t>(k.edge ^ (uint64_t{k.parent} * 0x9e3779b97f4a7c15ull));
    }
  };

  uint32_t edge_tokens(uint32_t node) const {
    return static_cast<uint32_t>(nodes_[node].pages.size()) * page_size_;
  }
  uint64_t page_hash(const TokenContent& content, uint32_t pos) const;
  uint32_t find_child(uint32_t parent, uint64_t edge) const;
  uint32_t new_node();
  uint32_t split(uint32_t node, uint32_t at);
  void touch(uint32_t node, bool count_hit);
  LeafKey leaf_key(uint32_t node) const;
  void refresh(uint32_t node);  // re-files the node in the evictable leaf set
  void unfile(uint32_t node);

  uint32_t page_size_;
  Policy policy_;
  uint64_t now_ = 0;
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_nodes_;
  std::unordered_map<ChildKey, uint32_t, ChildHash> children_;
  std::set<LeafKey> leaves_;
  uint64_t evictable_pages_ = 0;
  uint64_t protected_pages_ = 0;
};

}  // namespace memsim
