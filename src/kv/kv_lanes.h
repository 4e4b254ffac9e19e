// The lanes of a step executor over KV cache groups: layers that attend alike (one group's block
// table, one sliding window), as vLLM's GPU model runner gives each KV cache group a block table
// of its own (MultiGroupBlockTable) and each attention layer its own window.
#pragma once

#include <cstdint>
#include <vector>

#include "src/kv/kv_cache_manager.h"

namespace memsim {

// One lane: the group whose table the layers read and their window (0 = full attention).
struct KvLane {
  uint32_t group = 0, window = 0;
  bool operator==(const KvLane&) const = default;
};

struct KvLanes {
  std::vector<KvLane> lanes;         // in the order of their first layer
  std::vector<uint32_t> layer_lane;  // per layer of the model: its lane
  uint32_t groups = 1;               // KV cache groups of the pool (a slot mapping each)
};

// The lanes of `layers` layers over `layout` (KvLayout::layer_group; empty: every layer in group
// 0). `layer_windows` are the layers' own windows (ModelShape::layer_windows; empty: none): under
// vLLM's --disable-hybrid-kv-cache-manager a sliding layer keeps its window over the one full
// table (unify_hybrid_kv_cache_specs: "The compute of layers like sliding window is still saved").
KvLanes kv_lanes(const KvLayout& layout, const std::vector<uint32_t>& layer_windows,
                 uint32_t layers);

// Group `group`'s block table of `seq` as the kernels read it: blocks a sliding window freed
// (-1) point at block 0 (vLLM's null block; no kernel reads a tile wholly before its window).
void kernel_group_table(const KvCacheManager& kv, SeqId seq, uint32_t group,
                        std::vector<int32_t>* out);

}  // namespace memsim
