// Role interface of the KV-cache family: pools of KV slots that sequences grow into, share,
// release and (with prefix caching) leave behind for later requests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "src/kv/kv_groups.h"
#include "src/kv/token_content.h"

namespace memsim {

using SeqId = uint32_t;

// A live sequence and a length in tokens (background_step's argument).
struct SeqLength {
  SeqId seq = 0;
  uint32_t tokens = 0;
};

// What the engine tells a strategy at init: the model's KV geometry and the pool's limits.
struct KvInit {
  uint32_t layers = 0;
  uint64_t kv_bytes_per_token = 0;  // K and V of every layer (ModelShape::kv_bytes_per_token)
  uint64_t budget_bytes = 0;        // the pool may take at most this much device memory
  uint32_t max_num_seqs = 0;        // sequences alive at once (slots, block-table rows)
  uint32_t max_model_len = 0;       // longest sequence in tokens
  // The layers' KV cache groups (kv_groups.h, vLLM's): empty or one full-attention group of
  // every layer for a model without sliding-window layers. A strategy that does not
  // holds_kv_groups() is only given that; the engine refuses it any other.
  std::vector<KvCacheGroup> groups;
  uint64_t layer_kv_bytes_per_token() const { return kv_bytes_per_token / layers; }
  uint64_t row_bytes() const { return layer_kv_bytes_per_token() / 2; }  // one layer's K of a token
};

// A strategy's state in its own allocation unit ("block"): a paged block, a radix page, a
// contiguous slab, a group of mapped VMM pages. All counters are exact.
struct KvStats {
  uint64_t block_tokens = 0;     // token slots per block
  uint64_t block_bytes = 0;      // device bytes per block
  uint64_t total_blocks = 0;     // blocks the pool can hold (for vmm_contiguous: page groups)
  uint64_t used_blocks = 0;      // referenced by a live sequence
  uint64_t cached_blocks = 0;    // unreferenced but holding reusable prefix KV (evictable)
  uint64_t free_blocks = 0;      // neither (total = used + cached + free)
  uint64_t slots_allocated = 0;  // token slots in used blocks
  uint64_t tokens_stored = 0;    // KV tokens written in used blocks (each shared slot once)
  uint64_t pool_bytes = 0;       // device bytes the pool holds from the backend now
  uint64_t metadata_bytes = 0;   // block tables / req-to-token tables on the device
  // Host-side bookkeeping the OrinMLLM seed counts as extra overhead (16.7); 0 where a strategy
  // has none of its own: the host copy of the block tables (block_table_cpu_) and the free list,
  // one int32 per physical block (free_list_).
  uint64_t host_table_bytes = 0;
  uint64_t free_list_bytes = 0;
  uint64_t cow_copies = 0;  // blocks copied on write (or eagerly at fork)
  uint64_t cow_bytes = 0;
  uint64_t evicted_blocks = 0;  // cached blocks reclaimed for new allocations
  uint64_t pool_growths = 0;    // a growing pool: times it took more memory after init
  uint64_t max_blocks = 0;      // a growing pool: the blocks it may grow to (else total_blocks)
  // Every byte of the pool's metadata: device tables, their host copy and the free list.
  uint64_t overhead_bytes() const { return metadata_bytes + host_table_bytes + free_list_bytes; }
};

// Where a strategy keeps K and V, as the attention kernels address them (kernels/
// attention_types.h, KvLayerView): a row is one layer's K (or V) of one token, row_bytes long.
// Row of position p of a sequence in layer l:
//   k[l] (or v[l]) + table[p / block_tokens] * block_stride + (p % block_tokens) * row_bytes
// where table = seq_table(seq). Paged pools: the table lists the sequence's block ids. Contiguous
// pools: the table is {slot} and block_tokens is the tokens a slot holds (the address is then
// k[l] + slot * block_stride + p * row_bytes).
struct KvLayout {
  bool paged = true;
  uint32_t block_tokens = 0;
  uint64_t block_stride = 0;  // bytes between consecutive block ids (slots)
  uint64_t row_bytes = 0;     // kv_heads x head_dim x element bytes
  uint64_t blocks = 0;        // block ids (slots) are in [0, blocks)
  std::vector<DevPtr> k, v;   // per layer: row 0 of block (slot) 0
  // Per layer, the KV cache group whose block table addresses it (KvInit::groups); empty: every
  // layer reads seq_table's. Read a group's table with KvCacheManager::seq_group_table.
  std::vector<uint32_t> layer_group;
  // Per KV cache group, its sliding window in tokens (0: full attention); empty: no windows.
  std::vector<uint32_t> group_window;
  uint32_t group_of(uint32_t layer) const {
    return layer < layer_group.size() ? layer_group[layer] : 0;
  }
  uint32_t window_of(uint32_t layer) const {
    const uint32_t g = group_of(layer);
    return g < group_window.size() ? group_window[g] : 0;
  }
  // The row of position `pos` (K, or V when `value`) in layer `layer` for table `table`.
  DevPtr row(const std::vector<int32_t>& table, bool value, uint32_t layer, uint32_t pos) const {
    const DevPtr base = (value ? v : k)[layer];
    if (!paged) return base + static_cast<uint64_t>(table[0]) * block_stride + pos * row_bytes;
    return base + static_cast<uint64_t>(table[pos / block_tokens]) * block_stride +
           uint64_t{pos % block_tokens} * row_bytes;
  }
};

// The layout of a pool of `blocks` blocks at `pool`, `stride` bytes apart, each holding
// [layer][K, V][block_tokens][row] (every layer of a block together: one contiguous copy moves a
// block, and each layer's K is vLLM's [num_blocks, block_size, kv_heads, head_dim] with a block
// stride of the whole block).
inline KvLayout block_major_layout(DevPtr pool, const KvInit& init, uint32_t block_tokens,
                                   uint64_t stride, uint64_t blocks) {
  KvLayout l;
  l.paged = true;
  l.block_tokens = block_tokens;
  l.block_stride = stride;
  l.row_bytes = init.row_bytes();
  l.blocks = blocks;
  const uint64_t half = uint64_t{block_tokens} * l.row_bytes;  // one layer's K (or V) of a block
  for (uint32_t layer = 0; layer < init.layers; ++layer) {
    l.k.push_back(pool + 2 * layer * half);
    l.v.push_back(pool + (2 * layer + 1) * half);
  }
  return l;
}

// Contract (every implementation; the 1M-op stress test, tests/test_kv_stress.cpp, and
// tests/test_kv_content.cpp check it against each registered strategy):
// - init creates the pool through the Backend within budget_bytes (kOutOfMemory when not even
//   one sequence of one block fits); shutdown returns every byte to the Backend. Nothing else
//   talks to the device except CoW copies (Backend::copy) and on-demand mappings (vmm).
// - Sequences are numbered by the caller; a SeqId is live from its first grow (or fork) until
//   release. grow(seq, content, n) makes the sequence hold KV for tokens [0, n) of `content`
//   (n >= its current length, n <= content.size() and <= max_model_len). It is all-or-nothing:
//   on kOutOfMemory nothing changed. A new sequence may start from a cached prefix: pass the
//   `prefix_tokens` that lookup_prefix(content) returned just before (0 for none); those tokens
//   are then shared, not allocated.
// - lookup_prefix has no side effects. It returns how many leading tokens of `content` are
//   cached (a multiple of the block size for paged pools, of the page size for radix), at most
//   content.size() - 1 (the last token is always recomputed, as vLLM and SGLang do).
// - fork(parent, child) makes child hold the same tokens as parent, sharing blocks (refcounts
//   or lock references) where the strategy can, copying where it cannot. Appending to a shared
//   partial block copies it first (copy-on-write) when the strategy shares.
// - release(seq, content) drops the sequence. `content` ends where its computed KV ends (tokens
//   [0, content.size()); tokens grown for a step or a swap-in that never ran are past it). With
//   prefix caching, its full blocks of those tokens stay cached (evictable) under `content`'s
//   tokens; blocks past it hold no KV and must not be cached by the release.
// - Private content (TokenContent::private_from): a strategy may defer work for the tokens past
//   the hint (paged_block_pool defers hashing the blocks that reach past it: no lookup can hit
//   them), but the hint never changes a result: lookups, tables and stats are exactly what they
//   would be without it. publish(seq, content) says the hint is gone for good (`content`, with
//   kShared, covers the sequence's tokens; its owner will look it up again): the strategy does
//   the deferred work now. The engine publishes every sequence of a group it preempts, before
//   releasing it; a release with the hint still set ends the private content's life.
// - layout() describes the pool from init to shutdown (fixed addresses); seq_table(seq) gives a
//   live sequence's table (block ids covering seq_capacity, or {slot}). Two live sequences
//   reach the same row only for positions where they share KV (a cached prefix, blocks shared
//   after fork until copy-on-write). tests/test_kv_stress.cpp tracks what every row holds
//   (KvContentShadow) and checks that each sequence reads its own tokens.
// - Background work (optional; vAttention's memory-manager thread): when has_background(), the
//   engine calls background_step once per step, after the step's grows, with the lengths the
//   scheduled sequences have once the step computed. The strategy may map memory ahead of need
//   or reclaim unused memory then, through the Backend as always; the engine overlaps the time
//   of those calls with the step's compute and only their excess delays the next step. It must
//   not change any sequence's tokens, table or capacity; it never fails (what it could not map
//   is mapped by the next grow, on the critical path). Sequences it does not know are skipped.
// - stats() is exact; check_invariants() verifies the strategy's internal invariants (no block
//   owned twice without a matching refcount, refcounts never negative, blocks conserved).
class KvCacheManager {
 public:
  virtual ~KvCacheManager() = default;
  virtual std::string_view name() const = 0;

  virtual Status init(Backend& backend, const KvInit& init) = 0;
  virtual Status shutdown() = 0;

  virtual uint32_t lookup_prefix(const TokenContent& content) const = 0;
  // lookup_prefix's match with what an SGLang-style scheduler weighs (PrefillAdder,
  // dfs-weight): the tokens of evictable (unlocked) cached blocks on it, which locking the
  // prefix takes out of free_token_capacity, and the cache's node ids on its path from the root
  // (empty where the cache keeps no tree).
  struct PrefixMatch {
    uint32_t tokens = 0;
    uint64_t evictable_tokens = 0;
    std::vector<uint32_t> path;
  };
  virtual PrefixMatch match_prefix(const TokenContent& content) const {
    return {lookup_prefix(content), 0, {}};
  }
  virtual Status grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
                      uint32_t prefix_tokens) = 0;
  virtual Status fork(SeqId parent, SeqId child) = 0;
  virtual void release(SeqId seq, const TokenContent& content) = 0;
  // The sequence's content is no longer private (see the contract); default: nothing deferred.
  virtual void publish(SeqId /*seq*/, const TokenContent& /*content*/) {}

  // Tokens the sequence holds (0 if not live) and device bytes of the blocks it references.
  virtual uint32_t seq_tokens(SeqId seq) const = 0;
  virtual uint64_t seq_bytes(SeqId seq) const = 0;
  // Tokens the sequence can hold before its next grow must allocate, copy or map anything;
  // growing within it only updates counters, so engines may defer those grows (batching them
  // until a block boundary or a stats read). Conservative default: no slack.
  virtual uint32_t seq_capacity(SeqId seq) const { return seq_tokens(seq); }
  // Token slots a new sequence could still obtain now: free plus evictable blocks times
  // block_tokens (static_contiguous: free slabs times max_model_len).
  virtual uint64_t free_token_capacity() const = 0;

  // Traits, fixed by the config (answered before init too):
  // - whether released KV stays cached for later lookup_prefix hits (prefix caching);
  virtual bool caches_prefixes() const { return false; }
  // - tokens per entry of a vLLM-style block table ([max_num_seqs, max_model_len / tokens]),
  //   the input the model's captured graphs read the KV through; 0: the strategy has none.
  virtual uint32_t block_table_tokens() const { return 0; }
  // - whether it holds KvInit::groups as vLLM's hybrid KV cache manager does: one block table
  //   per group over one pool, a sliding-window group freeing the blocks that left its window
  //   (paged_block_pool). Without it, a model with sliding-window layers is refused (the engine
  //   says so) unless the hybrid manager is disabled and the model also has full-attention
  //   layers, which then makes every layer full attention, as vLLM does.
  virtual bool holds_kv_groups() const { return false; }

  // Freeing a sequence's earliest blocks (the OrinMLLM seed's strategy 3, 10.4: "free the
  // blocks of positions [0, 511] of a long sequence; the freed tokens are prefilled again").
  // - frees_front(): whether the strategy can (a trait; default no).
  // - release_front(seq, bytes, max_tokens) frees the live sequence's leading blocks, from the
  //   first it still holds, until `bytes` of blocks went back to the free pool (a block another
  //   sequence shares is dropped but frees nothing) or one more would leave more than
  //   `max_tokens` tokens missing; never its last block. Returns the tokens now missing at its
  //   front (front_gap; a multiple of the block size, 0 when nothing could be freed).
  // - The sequence keeps its length. Its next grow (to any length >= it) first allocates the
  //   missing blocks again, all-or-nothing with the growth; the caller then recomputes their KV.
  //   While a gap lasts, seq_capacity is 0, seq_table has -1 for the missing blocks, seq_bytes
  //   counts the blocks held, and fork of the sequence is kInvalidArgument.
  virtual bool frees_front() const { return false; }
  virtual uint32_t release_front(SeqId /*seq*/, uint64_t /*bytes*/, uint32_t /*max_tokens*/) {
    return 0;
  }
  virtual uint32_t front_gap(SeqId /*seq*/) const { return 0; }

  // Background work overlapped with compute (see the contract); default none.
  virtual bool has_background() const { return false; }
  virtual void background_step(const std::vector<SeqLength>& /*after_step*/) {}

  virtual KvLayout layout() const = 0;
  virtual void seq_table(SeqId seq, std::vector<int32_t>* out) const = 0;
  // KV cache group `group`'s block table of the sequence (vLLM: one block table per group; the
  // layers of KvLayout::layer_group read it), -1 for a block its sliding window freed (vLLM's
  // null block: never read). Strategies of one group: seq_table's.
  virtual void seq_group_table(SeqId seq, uint32_t /*group*/, std::vector<int32_t>* out) const {
    seq_table(seq, out);
  }

  virtual KvStats stats() const = 0;
  virtual bool check_invariants(std::string* why) const = 0;
};

// Why `kv` cannot be given `init`'s KV cache groups (empty: it can): groups with a sliding window
// need a strategy that holds_kv_groups(), and a step executor that reads each group's table with
// its window (`executor`: the run has one that does not, StepExecutor::reads_kv_groups).
std::string kv_groups_refusal(const KvCacheManager& kv, const KvInit& init, bool executor);

}  // namespace memsim
