// Tile geometry shared by the attention kernels and their CPU planner (one source of truth).
#pragma once

#include <cstdint>

namespace memsim::kernels {

inline constexpr uint32_t kMaxGroup = 8;     // query heads per KV head the kernels accept
inline constexpr uint32_t kDecodeTile = 64;  // KV tokens per decode tile (4 warps x 16)
inline constexpr uint32_t kDecodeRows = 16;  // query rows of a decode CTA (the group, padded)

// Query rows (token x group head) of a prefill CTA: four warps of two 16-row m-tiles each (every
// K/V fragment loaded from shared memory feeds two MMAs), one m-tile at head_dim 256 (registers).
constexpr uint32_t prefill_rows(uint32_t head_dim) {
  return head_dim >= 256 ? 64 : 128;
}

// KV tokens per prefill tile: 64, halved at head_dim 256 to keep two stages in shared memory.
constexpr uint32_t prefill_kv_tile(uint32_t head_dim) {
  return head_dim >= 256 ? 32 : 64;
}

}  // namespace memsim::kernels
