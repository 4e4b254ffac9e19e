// KV cache groups: which layers share a block table, and each group's attention window, formed
// as vLLM V1 forms them for models with full-attention and sliding-window layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memsim {

// One KV cache group (vLLM KVCacheGroupSpec): layers of one attention kind that share a block
// table. A paged pool's block holds block_size tokens of `group size` layers (the most layers of
// any group), and each group's table points into the one shared pool.
struct KvCacheGroup {
  uint32_t window = 0;           // 0: full attention; else the sliding window in tokens
  std::vector<uint32_t> layers;  // the model's layers (of the shape the pool serves) in the group
};

// vLLM's get_kv_cache_groups (vllm/v1/core/kv_cache_utils.py), for layers of one page size:
// - every layer of one kind (all full, or all sliding with one window): one group of them all
//   (_get_kv_cache_groups_uniform_spec): Mistral-7B-v0.1 is one sliding-window group;
// - both kinds with `hybrid` (the hybrid KV cache manager, vLLM's default): the kinds in the
//   order of their first layer, each split into ceil(count / group_size) groups taking every
//   n-th layer (layers[i::n]), group_size the fewest layers of any kind, or the most when that
//   is under 1.5 x the fewest (_get_kv_cache_groups_uniform_page_size). Gemma-3-12B (48 layers,
//   every 6th global): 5 sliding groups of 8 layers, then 1 full group of 8;
// - both kinds without `hybrid` (--disable-hybrid-kv-cache-manager): every layer full attention
//   in one group (unify_hybrid_kv_cache_specs turns the sliding specs into full ones).
// `layer_windows` has one entry per layer (0 = full attention).
std::vector<KvCacheGroup> kv_cache_groups(const std::vector<uint32_t>& layer_windows, bool hybrid);

// Layers one block holds: the most layers of any group (vLLM get_kv_cache_config_from_groups:
// group_size tensors, tensor i shared by layer i of every group; padding where a group has fewer).
uint32_t kv_group_size(const std::vector<KvCacheGroup>& groups);
bool any_window(const std::vector<KvCacheGroup>& groups);

// The blocks one request may hold at most, summed over the groups (vLLM's
// _max_memory_usage_bytes_from_groups over each spec's max_memory_usage_bytes, in blocks):
// a full-attention group cdiv(max_model_len, block), a sliding one
// cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block) + 1
// (vllm/v1/kv_cache_interface.py SlidingWindowSpec). vLLM's "maximum concurrency" is the pool's
// blocks over this.
uint64_t max_blocks_per_request(const std::vector<KvCacheGroup>& groups, uint32_t block_size,
                                uint32_t max_model_len, uint32_t max_num_batched_tokens);

// "6 groups of 8 layers: 5 x window 1024, 1 x full" for tables and logs.
std::string describe_kv_groups(const std::vector<KvCacheGroup>& groups);

}  // namespace memsim
