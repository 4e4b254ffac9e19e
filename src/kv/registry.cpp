// The KV-cache registry: one line per implementation, and the parsers of their typed configs.
#include "src/kv/registry.h"

#include <algorithm>
#include <iterator>

#include "src/kv/paged_block_pool.h"
#include "src/kv/radix_token_pool.h"
#include "src/kv/static_contiguous.h"
#include "src/kv/vmm_contiguous.h"

namespace memsim {
namespace {

// vLLM's choices and 4, which the OrinMLLM seed weighs (6.1.3: 4 to 128).
constexpr uint32_t kBlockSizes[] = {1, 4, 8, 16, 32, 64, 128, 256};

PagedBlockPoolConfig parse_paged_block_pool(const ConfigNode& node) {
  PagedBlockPoolConfig c;
  if (auto v = node.find("block_size")) {
    const uint64_t b = v->as_uint();
    if (std::find(std::begin(kBlockSizes), std::end(kBlockSizes), b) == std::end(kBlockSizes))
      v->fail(fmt::format("block size {} is not one of 1, 4, 8, 16, 32, 64, 128, 256", b));
    c.block_size = static_cast<uint32_t>(b);
  }
  if (auto v = node.find("layout"))
    c.per_layer = v->as_choice({"shared", "per_layer"}) == "per_layer";
  if (auto v = node.find("prefix_caching")) c.prefix_caching = v->as_bool();
  if (auto v = node.find("copy_on_write")) c.copy_on_write = v->as_bool();
  // vLLM reserves a null block; the seed's per-layer pool does not.
  c.null_block = !c.per_layer;
  if (auto v = node.find("null_block")) c.null_block = v->as_bool();
  if (auto v = node.find("free_list")) c.lifo_free_list = v->as_choice({"lru", "lifo"}) == "lifo";
  if (auto v = node.find("num_blocks_override")) {
    c.num_blocks_override = v->as_uint();
    if (c.num_blocks_override == 0)
      v->fail("must be positive (omit it to size the pool from the budget)");
  }
  if (auto v = node.find("initial_blocks")) {
    c.initial_blocks = v->as_uint();
    if (c.initial_blocks == 0) v->fail("must be positive (omit it to allocate the whole pool)");
  }
  if (auto v = node.find("grow_blocks")) {
    if (!c.initial_blocks)
      v->fail("grow_blocks needs initial_blocks (a pool that starts whole never grows)");
    c.grow_blocks = v->as_uint();
    if (c.grow_blocks == 0) v->fail("must be positive");
  }
  if (c.initial_blocks && !c.grow_blocks) c.grow_blocks = c.initial_blocks;
  return c;
}

RadixTokenPoolConfig parse_radix_token_pool(const ConfigNode& node) {
  RadixTokenPoolConfig c;
  if (auto v = node.find("page_size"))
    c.page_size = static_cast<uint32_t>(v->as_uint_in(1, RadixTokenPoolConfig::kMaxPageSize));
  if (auto v = node.find("disable_radix_cache")) c.disable_radix_cache = v->as_bool();
  if (auto v = node.find("eviction"))
    c.eviction =
        v->as_choice({"lru", "lfu"}) == "lfu" ? RadixTree::Policy::kLfu : RadixTree::Policy::kLru;
  return c;
}

StaticContiguousConfig parse_static_contiguous(const ConfigNode& /*node*/) {
  return {};  // no keys: the slab is max_model_len tokens
}

VmmContiguousConfig parse_vmm_contiguous(const ConfigNode& node) {
  VmmContiguousConfig c;
  if (auto v = node.find("page_size")) {
    c.page_size = v->as_bytes();
    if (c.page_size == 0)
      v->fail("must be positive: a multiple of the GPU's VMM granularity (2 MiB on H200)");
  }
  if (auto v = node.find("physical"))
    c.reserved_physical = v->as_choice({"reserved", "on_demand"}) == "reserved";
  if (auto v = node.find("reclaim"))
    c.deferred_reclaim = v->as_choice({"eager", "deferred"}) == "deferred";
  if (auto v = node.find("allocation")) c.async = v->as_choice({"async", "sync"}) == "async";
  if (auto v = node.find("eager_steps"))
    c.eager_steps = static_cast<uint32_t>(v->as_uint_in(1, 1u << 20));
  if (auto v = node.find("eager_groups"))
    c.eager_groups = static_cast<uint32_t>(v->as_uint_in(0, 1u << 20));
  return c;
}

}  // namespace

const Registry<KvEntry>& kv_strategies() {
  static const Registry<KvEntry> kRegistry{
      "KV-cache strategy",
      {
          {"paged_block_pool",
           "fixed-size KV blocks, LRU free queue, prefix hashing, CoW (vLLM)",
           {"block_size", "layout", "prefix_caching", "copy_on_write", "null_block",
            "num_blocks_override", "free_list", "initial_blocks", "grow_blocks"},
           parse_into<PagedBlockPool>(parse_paged_block_pool)},
          {"radix_token_pool",
           "token-slot pages, radix-tree prefix cache, LRU/LFU leaf eviction (SGLang)",
           {"page_size", "disable_radix_cache", "eviction"},
           parse_into<RadixTokenPool>(parse_radix_token_pool)},
          {"static_contiguous",
           "one max_model_len slab per sequence, reserved at init (FasterTransformer)",
           {},
           parse_into<StaticContiguous>(parse_static_contiguous)},
          {"vmm_contiguous",
           "per-request contiguous VA, pages mapped on demand (vAttention)",
           {"page_size", "physical", "reclaim", "allocation", "eager_steps", "eager_groups"},
           parse_into<VmmContiguous>(parse_vmm_contiguous)},
      }};
  return kRegistry;
}

}  // namespace memsim
