// RadixTree: page-aligned prefix matching, node splits, insertion, lock references and leaf
// eviction (SGLang RadixCache: match_prefix, _split_node, insert, inc/dec_lock_ref, evict).
#include "src/kv/radix_tree.h"

#include <fmt/format.h>
#include <algorithm>

namespace memsim {
namespace {

constexpr uint64_t kEdgeSeed = 0x7261646978747265ull;  // parent hash of every edge-key hash

}  // namespace

RadixTree::RadixTree(uint32_t page_size, Policy policy) : page_size_(page_size), policy_(policy) {
  clear();
}

void RadixTree::clear() {
  nodes_.assign(1, Node{});
  nodes_[kRoot].live = true;
  nodes_[kRoot].lock_ref = 1;  // SGLang's root is permanently locked
  free_nodes_.clear();
  children_.clear();
  leaves_.clear();
  evictable_pages_ = protected_pages_ = 0;
  now_ = 0;
}

uint64_t RadixTree::page_hash(const TokenContent& content, uint32_t pos) const {
  return content.chained_hash(kEdgeSeed, pos, pos + page_size_);
}

uint32_t RadixTree::find_child(uint32_t parent, uint64_t edge) const {
  auto it = children_.find(ChildKey{parent, edge});
  return it == children_.end() ? kNone : it->second;
}

RadixTree::Match RadixTree::match(const TokenContent& content, uint32_t limit) const {
  Match m;
  limit = limit / page_size_ * page_size_;
  uint32_t node = kRoot, pos = 0;
  while (pos < limit) {
    const uint32_t c = find_child(node, page_hash(content, pos));
    if (c == kNone) break;
    const uint32_t len = edge_tokens(c);
    const uint32_t end = std::min(pos + len, limit);
    const uint32_t same = nodes_[c].key.match_length(content, pos, end) / page_size_ * page_size_;
    if (same == 0) break;  // a hash collision: the child holds other tokens
    if (nodes_[c].lock_ref == 0) m.unlocked_pages += same / page_size_;
    m.tokens = pos + same;
    m.node = c;
    m.into = same;
    if (same < len) break;
    pos += len;
    node = c;
  }
  return m;
}

RadixTree::Descent RadixTree::descend(const TokenContent& content, uint32_t limit,
                                      bool count_hits) {
  limit = limit / page_size_ * page_size_;
  uint32_t node = kRoot, pos = 0;
  while (pos < limit) {
    const uint32_t c = find_child(node, page_hash(content, pos));
    if (c == kNone) break;
    const uint32_t len = edge_tokens(c);
    const uint32_t end = std::min(pos + len, limit);
    const uint32_t same = nodes_[c].key.match_length(content, pos, end) / page_size_ * page_size_;
    if (same == 0) break;
    touch(c, count_hits);
    if (same < len) {
      node = split(c, same);
      pos += same;
      break;
    }
    node = c;
    pos += len;
  }
  Descent d{node, pos, false};
  d.blocked = pos < limit && find_child(node, page_hash(content, pos)) != kNone;
  return d;
}

uint32_t RadixTree::new_node() {
  if (!free_nodes_.empty()) {
    const uint32_t id = free_nodes_.back();
    free_nodes_.pop_back();
    nodes_[id].live = true;
    return id;
  }
  nodes_.emplace_back();
  nodes_.back().live = true;
  return static_cast<uint32_t>(nodes_.size() - 1);
}

uint32_t RadixTree::split(uint32_t c, uint32_t at) {
  const uint32_t mid = new_node();  // (may move nodes_: take references after)
  Node& n = nodes_[c];
  Node& m = nodes_[mid];
  const uint32_t split_pages = at / page_size_;
  m.parent = n.parent;
  m.depth = n.depth;
  m.lock_ref = n.lock_ref;  // every sequence through the child passes the new prefix node
  m.children = 1;
  m.edge_key = n.edge_key;
  m.last_access = n.last_access;
  m.hits = n.hits;
  m.key = n.key.slice(n.depth, n.depth + at);
  m.pages.assign(n.pages.begin(), n.pages.begin() + split_pages);
  n.pages.erase(n.pages.begin(), n.pages.begin() + split_pages);
  n.key = n.key.slice(n.depth + at, n.key.size());
  n.depth += at;
  n.parent = mid;
  n.edge_key = page_hash(n.key, n.depth);
  children_[ChildKey{m.parent, m.edge_key}] = mid;
  children_.emplace(ChildKey{mid, n.edge_key}, c);
  // Page counts of lock states are unchanged; the child keeps its leaf status and key.
  return mid;
}

void RadixTree::touch(uint32_t node, bool count_hit) {
  Node& n = nodes_[node];
  n.last_access = now_;
  if (count_hit) ++n.hits;
  refresh(node);
}

uint32_t RadixTree::add_leaf(uint32_t parent, const TokenContent& content, uint32_t end,
                             std::vector<uint32_t> pages) {
  const uint32_t depth = end_of(parent);
  const uint32_t id = new_node();
  Node& n = nodes_[id];
  n.parent = parent;
  n.depth = depth;
  n.key = content.slice(depth, end);
  n.pages = std::move(pages);
  n.edge_key = page_hash(content, depth);
  n.last_access = now_;
  evictable_pages_ += n.pages.size();
  children_.emplace(ChildKey{parent, n.edge_key}, id);
  ++nodes_[parent].children;
  refresh(parent);
  refresh(id);
  return id;
}

void RadixTree::lock(uint32_t node) {
  for (; node != kRoot; node = nodes_[node].parent) {
    Node& n = nodes_[node];
    if (n.lock_ref++ == 0) {
      evictable_pages_ -= n.pages.size();
      protected_pages_ += n.pages.size();
      refresh(node);
    }
  }
}

void RadixTree::unlock(uint32_t node) {
  for (; node != kRoot; node = nodes_[node].parent) {
    Node& n = nodes_[node];
    if (--n.lock_ref == 0) {
      evictable_pages_ += n.pages.size();
      protected_pages_ -= n.pages.size();
      refresh(node);
    }
  }
}

uint64_t RadixTree::evict(uint64_t pages, std::vector<uint32_t>* out) {
  uint64_t freed = 0;
  while (freed < pages && !leaves_.empty()) {
    const uint32_t id = leaves_.begin()->id;
    unfile(id);
    Node& n = nodes_[id];
    freed += n.pages.size();
    evictable_pages_ -= n.pages.size();
    out->insert(out->end(), n.pages.begin(), n.pages.end());
    children_.erase(ChildKey{n.parent, n.edge_key});
    const uint32_t parent = n.parent;
    n = Node{};
    free_nodes_.push_back(id);
    --nodes_[parent].children;
    refresh(parent);  // a parent left without children becomes a leaf (SGLang pushes it)
  }
  return freed;
}

RadixTree::LeafKey RadixTree::leaf_key(uint32_t node) const {
  const Node& n = nodes_[node];
  if (policy_ == Policy::kLfu) return {n.hits, n.last_access, node};
  return {n.last_access, 0, node};
}

void RadixTree::unfile(uint32_t node) {
  Node& n = nodes_[node];
  if (!n.in_leaves) return;
  leaves_.erase(n.filed);
  n.in_leaves = false;
}

void RadixTree::refresh(uint32_t node) {
  if (node == kRoot) return;
  Node& n = nodes_[node];
  const bool want = n.live && n.lock_ref == 0 && n.children == 0;
  if (n.in_leaves && want && n.filed == leaf_key(node)) return;
  unfile(node);
  if (!want) return;
  n.filed = leaf_key(node);
  leaves_.insert(n.filed);
  n.in_leaves = true;
}

bool RadixTree::check(std::string* why, const std::function<uint32_t(uint32_t)>& expected_locks,
                      const std::function<void(uint32_t)>& page) const {
  auto fail = [&](std::string msg) {
    if (why) *why = "radix tree: " + std::move(msg);
    return false;
  };
  const Node& root = nodes_[kRoot];
  if (!root.live || root.parent != kNone || !root.pages.empty() || root.lock_ref != 1)
    return fail("bad root");
  std::vector<uint32_t> kids(nodes_.size(), 0);
  for (const auto& [k, v] : children_) {
    if (k.parent >= nodes_.size() || v >= nodes_.size() || !nodes_[k.parent].live ||
        !nodes_[v].live || nodes_[v].parent != k.parent || nodes_[v].edge_key != k.edge)
      return fail(fmt::format("child entry ({}, {:#x}) -> {} is stale", k.parent, k.edge, v));
    ++kids[k.parent];
  }
  uint64_t evictable = 0, protected_pages = 0, live = 0, filed = 0;
  for (uint32_t id = 0; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    if (!n.live) continue;
    ++live;
    if (n.children != kids[id])
      return fail(fmt::format("node {} counts {} children, has {}", id, n.children, kids[id]));
    if (id == kRoot) continue;
    const uint32_t len = edge_tokens(id);
    if (n.pages.empty() || n.parent >= nodes_.size() || !nodes_[n.parent].live)
      return fail(fmt::format("node {} is empty or orphaned", id));
    if (n.depth != end_of(n.parent) || n.key.begin() != n.depth || n.key.size() != n.depth + len)
      return fail(fmt::format("node {} edge [{}, {}) does not continue its parent", id,
                              n.key.begin(), n.key.size()));
    if (n.edge_key != page_hash(n.key, n.depth) || find_child(n.parent, n.edge_key) != id)
      return fail(fmt::format("node {} is not filed under its first page", id));
    const uint32_t want_locks = expected_locks(id);
    if (n.lock_ref != want_locks)
      return fail(
          fmt::format("node {} lock_ref {} but {} sequences pass it", id, n.lock_ref, want_locks));
    if (n.lock_ref > nodes_[n.parent].lock_ref && n.parent != kRoot)
      return fail(fmt::format("node {} is locked more than its parent", id));
    (n.lock_ref ? protected_pages : evictable) += n.pages.size();
    const bool leaf = n.lock_ref == 0 && n.children == 0;
    if (leaf != n.in_leaves)
      return fail(fmt::format("node {} leaf status {} but filed {}", id, leaf, n.in_leaves));
    if (n.in_leaves) {
      ++filed;
      if (!(n.filed == leaf_key(id)) || !leaves_.count(n.filed))
        return fail(fmt::format("node {} is filed under a stale priority", id));
    }
    for (uint32_t p : n.pages) page(p);
  }
  if (live + free_nodes_.size() != nodes_.size()) return fail("node free list is inconsistent");
  if (filed != leaves_.size()) return fail("leaf set holds dead nodes");
  if (evictable != evictable_pages_ || protected_pages != protected_pages_)
    return fail(fmt::format("evictable {} / {}, protected {} / {}", evictable, evictable_pages_,
                            protected_pages, protected_pages_));
  return true;
}

}  // namespace memsim
