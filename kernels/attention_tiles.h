// Tile geometry shared by the attention kernels and their CPU planner (one source of truth).
#pragma once

#include <cstdint>

#include "kernels/fastdiv.h"  // MEMSIM_HD

namespace memsim::kernels {

inline constexpr uint32_t kMaxGroup = 8;     // query heads per KV head the kernels accept
inline constexpr uint32_t kDecodeTile = 64;  // KV tokens per decode tile (4 warps x 16)

// Resident decode CTAs per SM the decode kernel is built for (its launch bound): 3; 2 over an fp8
// cache (the 128-token tile loop keeps its registers); 1 at head_dim 256 (shared memory). The
// planners count a wave in min(this, DeviceLimits::decode_ctas_per_sm) CTAs per SM, so a plan for
// an fp8 or head_dim-256 shape does not count slots its kernel cannot fill.
constexpr uint32_t decode_ctas_bound(uint32_t head_dim, bool fp8_cache) {
  return head_dim >= 256 ? 1 : (fp8_cache ? 2 : 3);
}

// Query rows (token x group head) of a prefill CTA: four warps of two 16-row m-tiles each (every
// K/V fragment loaded from shared memory feeds two MMAs), one m-tile at head_dim 256 (registers).
constexpr uint32_t prefill_rows(uint32_t head_dim) {
  return head_dim >= 256 ? 64 : 128;
}

// KV tokens per prefill tile: 64, halved at head_dim 256 to keep two stages in shared memory.
constexpr uint32_t prefill_kv_tile(uint32_t head_dim) {
  return head_dim >= 256 ? 32 : 64;
}

// KV tokens per tile of the Hopper prefill kernel (attention_prefill_sm90.cu; head_dim 128, bf16
// and fp16 caches): a split planned for it cuts chunks of whole tiles of this length.
inline constexpr uint32_t kSm90KvTile = 128;

// Sliding-window attention (vLLM's sliding_window, FlashAttention's window_size = (window - 1,
// 0)): a query at position p sees keys at positions k with p - window < k <= p; window 0 is full
// attention. A decode query (p = kv_len - 1) so sees the last window_len(kv_len, window) tokens,
// starting at window_begin(kv_len, window).
MEMSIM_HD uint32_t window_begin(uint32_t kv_len, uint32_t window) {
  return window != 0 && kv_len > window ? kv_len - window : 0;
}
MEMSIM_HD uint32_t window_len(uint32_t kv_len, uint32_t window) {
  return kv_len - window_begin(kv_len, window);
}

// KV range [*begin, *end) of decode split `split` of `splits` for a sequence of kv_len tokens:
// contiguous, tile-aligned splits covering [0, kv_len); late splits may be empty (begin = end =
// kv_len). The decode kernel and the planner's decode_split_range share it.
MEMSIM_HD void split_range(uint32_t kv_len, uint32_t tile, uint32_t splits, uint32_t split,
                           uint32_t* begin, uint32_t* end) {
  const uint32_t tiles = (kv_len + tile - 1) / tile;
  const uint32_t per_split = (tiles + splits - 1) / splits;
  const uint64_t b = uint64_t{split} * per_split * tile;
  const uint64_t e = b + uint64_t{per_split} * tile;
  *begin = static_cast<uint32_t>(b < kv_len ? b : kv_len);
  *end = static_cast<uint32_t>(e < kv_len ? e : kv_len);
}

}  // namespace memsim::kernels
