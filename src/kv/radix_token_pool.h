// radix_token_pool: SGLang's KV cache — a token-slot pool in pages of 1..n tokens
// (TokenToKVPoolAllocator / PagedTokenToKVPoolAllocator), a req_to_token table, and a radix
// tree of finished requests' tokens (RadixCache) with lock references and LRU/LFU eviction.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/kv/kv_cache_manager.h"
#include "src/kv/radix_tree.h"

namespace memsim {

struct RadixTokenPoolConfig {
  static constexpr uint32_t kMaxPageSize = 1024;
  uint32_t page_size = 1;            // SGLang --page-size (default 1: one token per slot)
  bool disable_radix_cache = false;  // SGLang --disable-radix-cache
  RadixTree::Policy eviction = RadixTree::Policy::kLru;  // SGLang --radix-eviction-policy
};

// Pool layout: one device allocation of (pages + 1) pages of page_size x kv_bytes_per_token
// bytes; page 0 is SGLang's padding page (dummy writes of padded tokens) and is never handed
// out, so pages = budget / page_bytes - 1 (SGLang's max_total_num_tokens / page_size, with the
// padding page kept inside the budget). Every usable page is, at any time, in exactly one of:
// the free list, the radix tree (locked by live sequences or evictable), or the private pages
// of one live sequence (tokens past its locked tree prefix, not yet inserted).
//
// Semantics (SGLang's in brackets):
// - lookup_prefix is a pure walk [match_prefix also splits and touches]; grow of a new
//   sequence redoes the match up to prefix_tokens, splits the edge there, touches the path and
//   locks it (inc_lock_ref) before anything is evicted.
// - grow checks need <= free + evictable (minus evictable pages on the prefix it locks) first
//   and fails with kOutOfMemory having changed nothing, not even evicting [the scheduler's
//   PrefillAdder admits against available + evictable the same way]; otherwise it evicts the
//   shortfall, whole leaves, lowest priority first [evict_from_tree_cache].
// - release inserts the page-aligned part of the tokens whose KV was computed (the first
//   content.size() of its tokens) with their pages, frees its duplicates of pages already in the
//   tree and every other private page (the unaligned tail, pages of tokens never computed), and
//   unlocks its path [cache_finished_req: the insert covers kv_committed_len tokens, the
//   over-allocated rest is freed]. The sequence's own content (from its last grow) keys the
//   insert; the `content` argument only bounds it.
// - fork inserts the parent's full pages [cache_unfinished_req], locks that path for the child
//   too and copies the parent's partial tail page (Backend::copy; cow_copies); the two then
//   grow independently. With disable_radix_cache every page is copied.
// - LFU counts a hit on each existing node an insert passes [_inc_hit_count]; ties go to the
//   older access, then the lower node id. Freed pages go to the back of the free list for page
//   size 1 and to the front, sorted, for larger pages [the two allocators' free()].
// - Live sequences are not limited to max_num_seqs here (the scheduler's job); req_to_token is
//   only accounted in metadata_bytes as int32 [max_num_seqs, max_model_len + 4].
class RadixTokenPool final : public KvCacheManager {
 public:
  explicit RadixTokenPool(RadixTokenPoolConfig config);

  std::string_view name() const override { return "radix_token_pool"; }
  Status init(Backend& backend, const KvInit& init) override;
  Status shutdown() override;
  uint32_t lookup_prefix(const TokenContent& content) const override;
  PrefixMatch match_prefix(const TokenContent& content) const override;
  Status grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
              uint32_t prefix_tokens) override;
  Status fork(SeqId parent, SeqId child) override;
  void release(SeqId seq, const TokenContent& content) override;
  uint32_t seq_tokens(SeqId seq) const override;
  uint64_t seq_bytes(SeqId seq) const override;
  // Its tree prefix plus its private pages (page-rounded), capped at max_model_len.
  uint32_t seq_capacity(SeqId seq) const override;
  uint64_t free_token_capacity() const override;
  bool caches_prefixes() const override { return !config_.disable_radix_cache; }
  KvLayout layout() const override;
  void seq_table(SeqId seq, std::vector<int32_t>* out) const override;
  KvStats stats() const override;
  bool check_invariants(std::string* why) const override;

  // SGLang RadixCache.evict(num_tokens): evicts cached (unlocked) leaves, lowest priority
  // first, until at least `pages` pages were evicted or nothing is evictable; returns the pages
  // evicted (whole nodes, so possibly more than asked). For tests and tools.
  uint64_t evict(uint64_t pages);

  // For tests and tools: the page ids backing a sequence's tokens in order (tree prefix, then
  // private pages), the tree, and how many leading tokens it holds through the tree.
  std::vector<uint32_t> page_table(SeqId seq) const;
  const RadixTree& tree() const { return tree_; }
  uint32_t seq_cached_tokens(SeqId seq) const;
  const RadixTokenPoolConfig& config() const { return config_; }

 private:
  struct Seq {
    uint32_t tokens = 0;
    uint32_t cached = 0;               // leading tokens held through the tree (page-aligned)
    uint32_t node = RadixTree::kRoot;  // deepest locked tree node; its end is `cached`
    std::vector<uint32_t> pages;       // private pages of tokens [cached, tokens)
    TokenContent content;              // covers [0, tokens) (fork inserts it)
  };

  uint32_t page_size() const { return config_.page_size; }
  uint64_t pages_for(uint64_t tokens) const { return (tokens + page_size() - 1) / page_size(); }
  uint64_t available_pages() const { return free_.size() + tree_.evictable_pages(); }
  Error out_of_pages(uint64_t need, uint64_t available) const;
  // Evicts tree leaves until `need` pages are free (the caller checked they can be).
  void make_free(uint64_t need);
  void take_pages(uint64_t n, std::vector<uint32_t>* out);
  void give_pages(const uint32_t* first, size_t n);  // back to the free list (SGLang order)
  // SGLang cache_unfinished_req / the insert of cache_finished_req: puts the sequence's full
  // pages of tokens [0, computed) into the tree under its content, frees its private duplicates
  // of pages already there and moves its lock to the new deepest node. Afterwards s.pages holds
  // only the pages past the tree (the partial tail page, pages past `computed`, or more after a
  // hash collision).
  void insert_into_tree(Seq& s, uint32_t computed);
  Status copy_page(uint32_t dst, uint32_t src);

  RadixTokenPoolConfig config_;
  KvInit init_;
  Backend* backend_ = nullptr;
  DevPtr pool_ = 0;
  uint64_t pool_bytes_ = 0;  // what the backend holds for the pool (granularity-rounded)
  uint64_t page_bytes_ = 0;
  uint32_t total_pages_ = 0;   // usable pages (ids 1..total_pages_)
  std::deque<uint32_t> free_;  // free page ids; allocation takes the front
  RadixTree tree_;
  std::unordered_map<SeqId, Seq> seqs_;
  uint64_t private_pages_ = 0;   // sum of seq.pages sizes
  uint64_t private_tokens_ = 0;  // sum of (tokens - cached)
  uint64_t cow_copies_ = 0;      // pages copied at fork
  uint64_t evicted_ = 0;         // pages evicted from the tree
};

}  // namespace memsim
