// The KV-cache registry: one line per implementation; each parses its own typed config.
#include "src/kv/registry.h"

#include "src/kv/paged_block_pool.h"
#include "src/kv/radix_token_pool.h"
#include "src/kv/static_contiguous.h"
#include "src/kv/vmm_contiguous.h"

namespace memsim {
namespace {

template <class Strategy>
KvStrategyInfo entry(std::string name, std::string summary) {
  return {std::move(name), std::move(summary), Strategy::params(), [](const ConfigNode& node) {
            auto config = Strategy::parse_config(node);
            return KvFactory([config] { return std::make_unique<Strategy>(config); });
          }};
}

}  // namespace

const std::vector<KvStrategyInfo>& kv_strategies() {
  static const std::vector<KvStrategyInfo> kRegistry = {
      entry<PagedBlockPool>("paged_block_pool",
                            "fixed-size KV blocks, LRU free queue, prefix hashing, CoW (vLLM)"),
      entry<RadixTokenPool>(
          "radix_token_pool",
          "token-slot pages, radix-tree prefix cache, LRU/LFU leaf eviction (SGLang)"),
      entry<StaticContiguous>(
          "static_contiguous",
          "one max_model_len slab per sequence, reserved at init (FasterTransformer)"),
      entry<VmmContiguous>("vmm_contiguous",
                           "per-request contiguous VA, pages mapped on demand (vAttention)"),
  };
  return kRegistry;
}

const KvStrategyInfo* find_kv_strategy(std::string_view name) {
  for (const auto& s : kv_strategies())
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string> kv_strategy_names() {
  std::vector<std::string> names;
  for (const auto& s : kv_strategies()) names.push_back(s.name);
  return names;
}

}  // namespace memsim
