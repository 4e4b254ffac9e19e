// KV cache groups: vLLM V1's grouping of full-attention and sliding-window layers.
#include "src/kv/kv_groups.h"

#include "src/kv/kv_cache_manager.h"

#include <fmt/format.h>
#include <algorithm>

namespace memsim {

std::vector<KvCacheGroup> kv_cache_groups(const std::vector<uint32_t>& layer_windows, bool hybrid) {
  // Layers by kind, the kinds in the order of their first layer (vLLM's same_type_layers dict).
  std::vector<KvCacheGroup> kinds;
  for (uint32_t l = 0; l < layer_windows.size(); ++l) {
    const uint32_t w = layer_windows[l];
    auto it = std::find_if(kinds.begin(), kinds.end(),
                           [w](const KvCacheGroup& k) { return k.window == w; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), KvCacheGroup{w, {}});
    it->layers.push_back(l);
  }
  if (kinds.size() <= 1) return kinds;
  const bool has_full =
      std::any_of(kinds.begin(), kinds.end(), [](const KvCacheGroup& k) { return !k.window; });
  if (!hybrid && has_full) {  // unify_hybrid_kv_cache_specs: every layer full attention
    KvCacheGroup all{0, {}};
    for (uint32_t l = 0; l < layer_windows.size(); ++l) all.layers.push_back(l);
    return {all};
  }
  size_t fewest = SIZE_MAX, most = 0;
  for (const KvCacheGroup& k : kinds) {
    fewest = std::min(fewest, k.layers.size());
    most = std::max(most, k.layers.size());
  }
  const size_t group_size = double(most) < double(fewest) * 1.5 ? most : fewest;
  std::vector<KvCacheGroup> groups;
  for (const KvCacheGroup& k : kinds) {
    const size_t n = (k.layers.size() + group_size - 1) / group_size;
    for (size_t i = 0; i < n; ++i) {
      KvCacheGroup g{k.window, {}};
      for (size_t j = i; j < k.layers.size(); j += n) g.layers.push_back(k.layers[j]);
      groups.push_back(std::move(g));
    }
  }
  return groups;
}

uint32_t kv_group_size(const std::vector<KvCacheGroup>& groups) {
  size_t most = 0;
  for (const KvCacheGroup& g : groups) most = std::max(most, g.layers.size());
  return static_cast<uint32_t>(most);
}

bool any_window(const std::vector<KvCacheGroup>& groups) {
  return std::any_of(groups.begin(), groups.end(), [](const KvCacheGroup& g) { return g.window; });
}

uint64_t max_blocks_per_request(const std::vector<KvCacheGroup>& groups, uint32_t block_size,
                                uint32_t max_model_len, uint32_t max_num_batched_tokens) {
  auto cdiv = [](uint64_t a, uint64_t b) { return (a + b - 1) / b; };
  uint64_t blocks = 0;
  for (const KvCacheGroup& g : groups) {
    if (!g.window) {
      blocks += cdiv(max_model_len, block_size);
      continue;
    }
    const uint64_t tokens =
        std::min<uint64_t>(uint64_t{g.window} - 1 + max_num_batched_tokens, max_model_len);
    blocks += cdiv(tokens, block_size) + 1;
  }
  return blocks;
}

std::string describe_kv_groups(const std::vector<KvCacheGroup>& groups) {
  std::string kinds;
  for (size_t i = 0; i < groups.size();) {
    size_t j = i;
    while (j < groups.size() && groups[j].window == groups[i].window) ++j;
    if (!kinds.empty()) kinds += ", ";
    kinds += fmt::format("{} x {}", j - i,
                         groups[i].window ? fmt::format("window {}", groups[i].window) : "full");
    i = j;
  }
  return fmt::format("{} group{} of {} layers: {}", groups.size(), groups.size() == 1 ? "" : "s",
                     kv_group_size(groups), kinds);
}

std::string kv_groups_refusal(const KvCacheManager& kv, const KvInit& init, bool executor) {
  if (!any_window(init.groups) || (kv.holds_kv_groups() && !executor)) return {};
  return fmt::format("{} cannot hold KV cache groups with sliding windows ({})",
                     executor ? "a step executor" : "the KV strategy " + std::string(kv.name()),
                     describe_kv_groups(init.groups));
}

}  // namespace memsim
