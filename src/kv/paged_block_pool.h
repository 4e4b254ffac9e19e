// paged_block_pool: vLLM-style paged KV cache — fixed-size blocks, per-sequence block tables,
// lazy allocation, an LRU free-block queue, prefix caching by chained block hashes, reference
// counts and copy-on-write of a shared partial block. With copy-on-write, blocks of private
// content (no lookup can reach them) are cached without being hashed; their hashes are
// computed if the content is published. Models with sliding-window layers: vLLM V1's hybrid KV
// cache manager, one block table per KV cache group over the one pool, a sliding-window group
// freeing the blocks that left its window (paged_block_pool_groups.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/kv/hash_index.h"
#include "src/kv/kv_cache_manager.h"
#include "src/kv/slot_map.h"

namespace memsim {

struct PagedBlockPoolConfig {
  uint32_t block_size = 16;  // tokens per block: 1, 4, 8, 16, 32, 64, 128 or 256
  // shared: one block holds K and V of every layer for block_size tokens (vLLM). per_layer: the
  // OrinMLLM seed's key pool and value pool, two allocations of [physical blocks, block_size,
  // kv_dim] shared by all layers, and a block-table row per layer; a logical block takes one
  // physical block per layer (layer l of unit u: block u x layers + l, the seed's tables on a
  // fresh pool), all layers allocated, shared, copied and freed together.
  bool per_layer = false;
  bool prefix_caching = true;        // vLLM V1 enable_prefix_caching (default on)
  bool copy_on_write = true;         // fork shares blocks (vLLM V0); false: fork copies every block
  bool null_block = true;            // vLLM V1 reserves block 0 as the null block
  uint64_t num_blocks_override = 0;  // vLLM num_gpu_blocks_override (physical blocks; 0 = budget)
  // Which free block an allocation takes. false: the least recently freed (vLLM's
  // FreeKVCacheBlockQueue, popleft). true: the most recently freed (the OrinMLLM seed's free_list_
  // stack, pop_back), blocks 0, 1, 2, ... first on a fresh pool.
  bool lifo_free_list = false;
  // A pool that grows (the OrinMLLM seed's strategy 4, 10.4 and 12.6: start small, add blocks
  // when the free list runs dry). 0: every block is allocated at init (one device_malloc). Else
  // init reserves virtual addresses for the cap (num_blocks_override, or what the budget holds)
  // and maps `initial_blocks` physical blocks; an allocation that finds too few free blocks
  // maps `grow_blocks` more at a time (create_physical + map + set_access, granule-rounded)
  // until it fits or the cap is reached. The pool never shrinks. Physical blocks (a multiple of
  // the layers with `per_layer`).
  uint64_t initial_blocks = 0;
  uint64_t grow_blocks = 0;
};

class PagedBlockPool final : public KvCacheManager {
 public:
  explicit PagedBlockPool(PagedBlockPoolConfig config) : config_(config) {}

  std::string_view name() const override { return "paged_block_pool"; }
  Status init(Backend& backend, const KvInit& init) override;
  Status shutdown() override;
  uint32_t lookup_prefix(const TokenContent& content) const override;
  Status grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
              uint32_t prefix_tokens) override;
  Status fork(SeqId parent, SeqId child) override;
  void release(SeqId seq, const TokenContent& content) override;
  void publish(SeqId seq, const TokenContent& content) override;
  uint32_t seq_tokens(SeqId seq) const override;
  uint64_t seq_bytes(SeqId seq) const override;
  uint32_t seq_capacity(SeqId seq) const override;
  uint64_t free_token_capacity() const override;
  bool caches_prefixes() const override { return config_.prefix_caching; }
  uint32_t block_table_tokens() const override { return config_.block_size; }
  bool holds_kv_groups() const override { return true; }
  // With sliding-window groups release_front frees nothing (their front is the window's to
  // free): preemption by free_front then falls back to recompute.
  bool frees_front() const override { return true; }
  uint32_t release_front(SeqId seq, uint64_t bytes, uint32_t max_tokens) override;
  uint32_t front_gap(SeqId seq) const override;
  KvLayout layout() const override;
  void seq_table(SeqId seq, std::vector<int32_t>* out) const override;
  KvStats stats() const override;
  bool check_invariants(std::string* why) const override;

  // Physical block ids of a sequence's logical blocks (per_layer: the id of its first layer's
  // block; layer l of logical block b is that id + l; UINT32_MAX for a block release_front
  // freed). For tests and tools.
  std::vector<uint32_t> block_table(SeqId seq) const;
  // Layer `layer`'s row of the block table (the seed's block_table_cpu_[layer]): per_layer, the
  // physical block of each logical block in the key (and value) pool; shared, block_table.
  std::vector<uint32_t> layer_table(SeqId seq, uint32_t layer) const;
  // KV cache group `group`'s block table of the sequence (kNone: a block its sliding window
  // freed, vLLM's null block), and the groups the pool holds (one full group without windows).
  std::vector<uint32_t> group_table(SeqId seq, uint32_t group) const;
  void seq_group_table(SeqId seq, uint32_t group, std::vector<int32_t>* out) const override;
  const std::vector<KvCacheGroup>& groups() const { return groups_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  // A free block's reusable contents: none, registered in the prefix cache under its hash, or
  // pending: a full block of private content whose hash is deferred, exactly what a registered
  // block would be (cached when free, evicted when reused) except that it is not in the index,
  // which no lookup could reach; hashed and registered if its sequence is published.
  enum class Cached : uint8_t { kNo, kRegistered, kPending };
  struct Block {  // 16 bytes: the free queue walks these
    uint32_t ref = 0;
    uint32_t prev = kNone;  // free-queue links (valid while ref == 0)
    uint32_t next = kNone;
    uint16_t filled = 0;  // tokens written (block_size <= 256)
    Cached cached = Cached::kNo;
    bool in_queue = false;
  };
  static_assert(sizeof(Block) == 16);
  // One KV cache group's table of a sequence (every group of a sequence holds `tokens`).
  struct Seq {
    std::vector<uint32_t> blocks;  // logical -> unit id
    uint32_t tokens = 0;
    uint32_t hashed = 0;     // leading full blocks already hashed (registered or duplicate)
    uint32_t marked = 0;     // leading full blocks hashed or pending (>= hashed)
    uint64_t last_hash = 0;  // chained hash of block hashed-1
    uint32_t gap = 0;        // leading logical blocks freed by release_front (kNone in blocks)
    uint32_t skipped = 0;    // leading blocks a sliding window freed (kNone: vLLM's null block)
  };
  using SeqGroups = std::vector<Seq>;  // one per KV cache group

  // Free queue (LRU): allocation pops the head, freed blocks append at the tail.
  void queue_push_back(uint32_t b);
  void queue_remove(uint32_t b);
  uint32_t queue_pop_front();
  uint32_t queue_pop_back();
  uint32_t allocate_unit();   // pops the LRU head, evicting its cached (or pending) hash
  void add_ref(uint32_t b);   // touch: leaves the free queue on 0 -> 1
  void drop_ref(uint32_t b);  // back to the queue tail on 1 -> 0
  void set_filled(uint32_t b, uint32_t filled);
  // Registers the sequence's full blocks under their chained hashes; unless `publish`, blocks
  // reaching past content.private_from() become pending instead.
  void cache_full_blocks(Seq& s, const TokenContent& content, uint32_t group, bool publish = false);
  // The prefix-cache key of a block of chained hash `h` in `group` (vLLM BlockHashWithGroupId):
  // group 0's is the hash itself.
  static uint64_t group_key(uint64_t h, uint32_t group) {
    return group ? h ^ (0x9e3779b97f4a7c15ull * group) : h;
  }
  // Sliding-window groups (paged_block_pool_groups.cpp):
  // vLLM HybridKVCacheCoordinator.find_longest_cache_hit over the groups.
  uint32_t lookup_groups(const TokenContent& content) const;
  // SlidingWindowManager.remove_skipped_blocks(computed) for every sliding-window group.
  void remove_skipped(SeqGroups& s, uint32_t computed);
  // Blocks before the window of `computed` tokens (get_num_skipped_tokens / block_size), for a
  // group of window `window`; at most `blocks`.
  uint32_t skipped_blocks(uint32_t window, uint32_t computed, size_t blocks) const;
  bool check_group(SeqId id, const Seq& s, uint32_t group, std::vector<uint32_t>& refs,
                   std::string* why) const;
  Status grow_new(SeqId seq, const TokenContent& content, uint32_t num_tokens,
                  uint32_t prefix_tokens);
  Status grow_live(SeqId seq, SeqGroups& live, const TokenContent& content, uint32_t num_tokens);
  static bool holds_cache(const Block& b) { return b.cached != Cached::kNo; }
  Status copy_unit(uint32_t dst, uint32_t src);
  // Growing pools: maps physical memory for units [blocks_.size(), units) and queues them free.
  Status map_units(uint64_t units);
  // Makes `need` units free, growing the pool by grow_blocks at a time; kOutOfMemory (nothing
  // grown) when even the cap would not hold them, or the backend's when it has no memory left.
  Status make_room(uint64_t need);
  bool grows() const { return config_.initial_blocks != 0; }
  uint32_t units_for(uint32_t tokens) const { return (tokens + block_size() - 1) / block_size(); }
  uint32_t block_size() const { return config_.block_size; }
  uint64_t physical_per_unit() const { return config_.per_layer ? init_.layers : 1; }
  // per_layer: the seed's key pool and value pool, two allocations; else one pool.
  uint32_t pool_count() const { return config_.per_layer ? 2 : 1; }
  uint64_t part_bytes() const { return unit_bytes_ / pool_count(); }  // a unit's bytes per pool

  PagedBlockPoolConfig config_;
  KvInit init_;
  Backend* backend_ = nullptr;
  std::vector<DevPtr> pools_;       // one pool, or the key and value pools (per_layer)
  uint64_t cap_units_ = 0;          // the most units the pool may hold
  uint64_t mapped_bytes_ = 0;       // growing pools: physical bytes mapped in each pool
  std::vector<PhysHandle> chunks_;  // growing pools: one handle per pool and growth
  uint64_t growths_ = 0;            // growing pools: times the pool grew after init
  uint64_t unit_bytes_ = 0;         // device bytes of one unit (one block, or one block per layer)
  std::vector<Block> blocks_;
  std::vector<uint64_t> hashes_;  // chained hash of each kRegistered block
  uint32_t head_ = kNone, tail_ = kNone;
  uint64_t queued_ = 0;      // units in the free queue (free + cached)
  uint64_t cached_ = 0;      // of those, units with a registered (or pending) hash
  uint64_t used_ = 0;        // units with ref > 0 (including the null block)
  uint64_t stored_ = 0;      // sum of filled over used units
  uint64_t cow_copies_ = 0;  // in units
  uint64_t evicted_ = 0;     // in units
  HashIndex cache_;          // group_key -> unit
  SlotMap<SeqGroups> seqs_;
  std::vector<KvCacheGroup> groups_;  // the KV cache groups (one full group without windows)
  uint32_t group_layers_ = 0;         // layers a unit holds: the most of any group
  bool windows_ = false;              // a group has a sliding window
};

}  // namespace memsim
