// paged_block_pool with sliding-window KV cache groups: vLLM V1's hybrid KV cache manager
// (vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator, single_type_kv_cache_manager.py
// FullAttentionManager and SlidingWindowManager): the prefix-cache hit over the groups and the
// freeing of the blocks that left a window.
#include <algorithm>

#include "src/kv/paged_block_pool.h"

namespace memsim {
namespace {

constexpr uint64_t kRootHash = 0x6d656d73696d6b76ull;  // as in paged_block_pool.cpp

}  // namespace

uint32_t PagedBlockPool::skipped_blocks(uint32_t window, uint32_t computed, size_t blocks) const {
  // SlidingWindowManager.get_num_skipped_tokens: max(0, computed - window + 1), the tokens
  // before the window of the next token; remove_skipped_blocks caps the blocks at those held.
  if (window == 0 || computed < window) return 0;
  const uint64_t skipped_tokens = uint64_t{computed} - window + 1;
  return static_cast<uint32_t>(std::min<uint64_t>(skipped_tokens / block_size(), blocks));
}

void PagedBlockPool::remove_skipped(SeqGroups& live, uint32_t computed) {
  for (uint32_t g = 0; g < live.size(); ++g) {
    Seq& s = live[g];
    const uint32_t n = skipped_blocks(groups_[g].window, computed, s.blocks.size());
    // remove_skipped_blocks: from block n - 1 down to the first null block, each freed
    // (block_pool.free_blocks in that order: a cached one stays cached, evictable) and nulled.
    for (uint32_t b = n; b-- > s.skipped;) {
      drop_ref(s.blocks[b]);
      s.blocks[b] = kNone;
    }
    s.skipped = std::max(s.skipped, n);
  }
}

// HybridKVCacheCoordinator.find_longest_cache_hit: the attention kinds, full attention first,
// each accept the candidate length or shorten it, until none shortens it (one pass for one full
// kind plus one other). A kind's block hits only if every group of the kind has it cached
// (block_pool.get_cached_block over the kind's group ids).
// - Full attention (FullAttentionManager): the leading blocks cached, left to right; computed
//   once, then only trimmed to the candidate.
// - A sliding window (SlidingWindowManager): from the candidate's last block leftwards, the
//   first run of cdiv(window - 1, block) cached blocks ends the hit; none: the run of cached
//   blocks from block 0 (a hit even if shorter).
// Not modelled: EAGLE's dropped block, alignment to another group's block size (every group
// has the pool's block size here), the retention interval.
uint32_t PagedBlockPool::lookup_groups(const TokenContent& content) const {
  const uint32_t max_blocks = (content.size() - 1) / block_size();
  std::vector<uint64_t> chain(max_blocks);
  uint64_t h = kRootHash;
  for (uint32_t b = 0; b < max_blocks; ++b)
    chain[b] = h = content.chained_hash(h, b * block_size(), (b + 1) * block_size());
  // The kinds: distinct windows, full attention first, the others in group order.
  std::vector<uint32_t> kinds;
  for (const KvCacheGroup& g : groups_)
    if (std::find(kinds.begin(), kinds.end(), g.window) == kinds.end()) kinds.push_back(g.window);
  std::stable_partition(kinds.begin(), kinds.end(), [](uint32_t w) { return w == 0; });
  auto cached = [&](uint32_t b, uint32_t window) {
    for (uint32_t g = 0; g < groups_.size(); ++g)
      if (groups_[g].window == window && cache_.find(group_key(chain[b], g)) == HashIndex::kNone)
        return false;
    return true;
  };
  const bool simple = kinds.size() == 2 && kinds[0] == 0;
  uint32_t hit = max_blocks;
  int64_t full_hit = -1;  // the full-attention kind's hit, once looked up
  while (true) {
    uint32_t cur = hit;
    for (const uint32_t window : kinds) {
      if (window == 0) {
        if (full_hit < 0) {
          uint32_t b = 0;
          while (b < cur && cached(b, 0)) ++b;
          full_hit = b;
        }
        cur = std::min<uint32_t>(cur, static_cast<uint32_t>(full_hit));
        continue;
      }
      const uint32_t contiguous = (window - 1 + block_size() - 1) / block_size();
      uint32_t run = 0, found = 0;
      bool match = false;
      for (uint32_t i = cur; i-- > 0;) {
        if (!cached(i, window)) {
          run = 0;
          continue;
        }
        if (++run >= contiguous) {
          found = i + run;
          match = true;
          break;
        }
      }
      cur = match ? found : run;
    }
    if (cur >= hit) break;
    hit = cur;
    if (simple) break;
  }
  return hit * block_size();
}

}  // namespace memsim
