// Sliding-window and hybrid attention in paged_block_pool (vLLM V1's hybrid KV cache manager):
// vLLM's grouping of layers, hand-derived block counts of a window group (remove_skipped_blocks),
// the sliding-window prefix-cache hit, the budget's blocks of a group, and the engine exact and
// leak-free over a Gemma-3-shaped model.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "src/kv/kv_groups.h"
#include "src/kv/paged_block_pool.h"
#include "src/serve/engine.h"
#include "src/serve/kv_budget.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

constexpr uint32_t kNull = UINT32_MAX;  // a block a window freed (vLLM's null block)

PagedBlockPool& pool(KvRig& rig) {
  return dynamic_cast<PagedBlockPool&>(*rig.kv);
}

uint32_t held(const std::vector<uint32_t>& table) {
  uint32_t n = 0;
  for (uint32_t b : table) n += b != kNull;
  return n;
}

// A tiny model: `layers` layers of one KV head of 8 dims (bf16: 32 B a layer and token).
ModelShape tiny(uint32_t layers, uint32_t window, uint32_t pattern) {
  ModelShape m;
  m.name = "tiny";
  m.layers = layers;
  m.hidden = 64;
  m.heads = 1;
  m.kv_heads = 1;
  m.head_dim = 8;
  m.intermediate = 64;
  m.vocab = 64;
  m.sliding_window = window;
  m.sliding_window_pattern = pattern;
  return m;
}

KvInit init_of(const ModelShape& m, uint64_t budget, bool hybrid = true) {
  KvInit i = kv_init_for(m, budget, 16, 8192);
  i.groups = kv_cache_groups(m.layer_windows(), hybrid);
  return i;
}

TEST_CASE("KV cache groups are formed as vLLM's kv_cache_utils forms them") {
  const ModelShape gemma = model_from_configs("gemma-3-12b");
  REQUIRE(gemma.layer_window(0) == 1024);
  REQUIRE(gemma.layer_window(5) == 0);  // (5 + 1) % 6 == 0: global
  REQUIRE(gemma.layer_window(47) == 0);
  const std::vector<KvCacheGroup> g = kv_cache_groups(gemma.layer_windows(), true);
  // 40 sliding, 8 full: group size min(40, 8) = 8 (40 >= 1.5 x 8): the sliding kind first (layer
  // 0 slides), split into 5 groups of every 5th sliding layer, then the full group.
  REQUIRE(g.size() == 6);
  for (int i = 0; i < 5; ++i) {
    CHECK(g[i].window == 1024);
    CHECK(g[i].layers.size() == 8);
  }
  CHECK(g[0].layers == std::vector<uint32_t>{0, 6, 12, 18, 24, 30, 36, 42});
  CHECK(g[1].layers == std::vector<uint32_t>{1, 7, 13, 19, 25, 31, 37, 43});
  CHECK(g[4].layers == std::vector<uint32_t>{4, 10, 16, 22, 28, 34, 40, 46});
  CHECK(g[5].window == 0);
  CHECK(g[5].layers == std::vector<uint32_t>{5, 11, 17, 23, 29, 35, 41, 47});
  CHECK(kv_group_size(g) == 8);
  CHECK(describe_kv_groups(g) == "6 groups of 8 layers: 5 x window 1024, 1 x full");
  // Hybrid manager off: every layer full attention, one group.
  const std::vector<KvCacheGroup> off = kv_cache_groups(gemma.layer_windows(), false);
  REQUIRE(off.size() == 1);
  CHECK(off[0].window == 0);
  CHECK(off[0].layers.size() == 48);
  // Mistral-7B-v0.1's shape: every layer slides: one group whatever the switch (vLLM unifies
  // only when full-attention layers are there too).
  for (bool hybrid : {true, false}) {
    const std::vector<KvCacheGroup> m = kv_cache_groups(tiny(32, 4096, 0).layer_windows(), hybrid);
    REQUIRE(m.size() == 1);
    CHECK(m[0].window == 4096);
    CHECK(m[0].layers.size() == 32);
  }
  // vLLM's docstring example: 10 full + 20 sliding layers (pattern 3): 3 groups of 10.
  const std::vector<KvCacheGroup> ten = kv_cache_groups(tiny(30, 512, 3).layer_windows(), true);
  REQUIRE(ten.size() == 3);
  CHECK(ten[0].window == 512);
  CHECK(ten[2].window == 0);
  CHECK(kv_group_size(ten) == 10);
  // 8 full + 9 sliding: 9 < 1.5 x 8, so the group size is 9 (the full group padded).
  std::vector<uint32_t> w(8, 0);
  w.insert(w.end(), 9, 64);
  const std::vector<KvCacheGroup> pad = kv_cache_groups(w, true);
  REQUIRE(pad.size() == 2);
  CHECK(pad[0].layers.size() == 8);
  CHECK(pad[1].layers.size() == 9);
  CHECK(kv_group_size(pad) == 9);
  // The most blocks a request holds (SlidingWindowSpec.max_memory_usage_bytes): full
  // cdiv(8192, 16) = 512; a window cdiv(min(1023 + 2048, 8192), 16) + 1 = 193, five of them.
  CHECK(max_blocks_per_request(g, 16, 8192, 2048) == 512 + 5 * 193);
  CHECK(max_blocks_per_request(g, 16, 8192, 8192) == 512 + 5 * 513);
  CHECK(max_blocks_per_request(off, 16, 8192, 8192) == 512);
}

TEST_CASE(
    "a 5,000-token request on Gemma-3-12B: the full group holds 313 blocks, each window "
    "group 65") {
  const ModelShape gemma = model_from_configs("gemma-3-12b");
  // A block: 16 tokens x 8 layers x 8 KiB (K and V of 8 heads x 256 x bf16) = 1 MiB.
  for (const bool caching : {false, true}) {
    KvRig rig(
        caching ? "{impl: paged_block_pool}" : "{impl: paged_block_pool, prefix_caching: false}",
        init_of(gemma, 2 * kGiB));
    KvStats s = rig.kv->stats();
    CHECK(s.block_bytes == kMiB);
    CHECK(s.total_blocks == 2048);
    CHECK(rig.kv->free_token_capacity() == 2047 / 6 * 16);  // vLLM's num_blocks // groups x 16
    const TokenContent text(11, 8192);
    auto sliding = [&](uint32_t g) { return held(pool(rig).group_table(0, g)); };
    // Chunked prefill of 2,048 tokens a step (vLLM allocate_slots each step, the window's
    // blocks freed on the tokens computed before the step).
    REQUIRE(rig.kv->grow(0, text, 2048, 0).ok());  // 128 blocks in each of the 6 groups
    CHECK(rig.kv->stats().used_blocks == 1 + 6 * 128);
    REQUIRE(rig.kv->grow(0, text, 4096, 0).ok());
    // Computed 2,048: skipped max(0, 2048 - 1024 + 1) = 1,025 tokens = 64 whole blocks freed.
    CHECK(sliding(0) == 256 - 64);
    CHECK(held(pool(rig).group_table(0, 5)) == 256);
    REQUIRE(rig.kv->grow(0, text, 5000, 0).ok());  // computed 4,096: 3,073 skipped, 192 blocks
    CHECK(sliding(1) == 313 - 192);
    CHECK(rig.kv->stats().used_blocks == 1 + 313 + 5 * 121);
    rig.check();
    // The first decode step: computed 5,000, 3,977 tokens skipped = 248 blocks; 5,001 tokens
    // still fit 313 blocks.
    REQUIRE(rig.kv->grow(0, text, 5001, 0).ok());
    for (uint32_t g = 0; g < 5; ++g) {
      const std::vector<uint32_t> t = pool(rig).group_table(0, g);
      REQUIRE(t.size() == 313);
      CHECK(t[247] == kNull);  // positions 3,952..3,967: wholly before the window 3,977..5,000
      CHECK(t[248] != kNull);  // 3,968..3,983 holds the window's first tokens
      CHECK(held(t) == 65);
    }
    CHECK(held(pool(rig).group_table(0, 5)) == 313);  // ceil(5,000 / 16)
    s = rig.kv->stats();
    CHECK(s.used_blocks == 1 + 313 + 5 * 65);
    CHECK(rig.kv->seq_bytes(0) == (313 + 5 * 65) * kMiB);
    // The freed blocks are full: with prefix caching they stay cached (evictable).
    CHECK(s.cached_blocks == (caching ? 5 * 248 : 0));
    CHECK(s.free_blocks + s.cached_blocks == 2048 - 1 - 313 - 5 * 65);
    CHECK(rig.kv->seq_capacity(0) == 5001);  // no slack: every step reaches the manager
    rig.check();
    // Decode: at computed 5,007 (3,984 skipped: 249 blocks) each window group drops a block;
    // position 5,008 (the 5,009th token) opens block 313 in every group.
    for (uint32_t n = 5002; n <= 5008; ++n) REQUIRE(rig.kv->grow(0, text, n, 0).ok());
    CHECK(sliding(2) == 64);
    CHECK(held(pool(rig).group_table(0, 5)) == 313);
    REQUIRE(rig.kv->grow(0, text, 5009, 0).ok());
    CHECK(sliding(2) == 65);
    CHECK(held(pool(rig).group_table(0, 5)) == 314);
    rig.kv->release(0, text.slice(0, 5008));
    rig.check();
    s = rig.kv->stats();
    CHECK(s.used_blocks == 1);  // only the null block: nothing leaked
    CHECK(s.free_blocks + s.cached_blocks == 2047);
    CHECK(s.cached_blocks == (caching ? 6 * 313 : 0));  // 5,008 tokens: 313 full blocks a group
    REQUIRE(rig.kv->shutdown().ok());
    CHECK(rig.backend.usage().physical_bytes == 0);
  }
}

TEST_CASE("without the hybrid manager a Gemma-3-12B block holds all 48 layers") {
  const ModelShape gemma = model_from_configs("gemma-3-12b");
  KvRig rig("{impl: paged_block_pool}", init_of(gemma, 2 * kGiB, false));
  CHECK(rig.kv->stats().block_bytes == 6 * kMiB);
  CHECK(rig.kv->stats().total_blocks == 341);  // 2 GiB / 6 MiB
  const TokenContent text(11, 8192);
  REQUIRE(rig.kv->grow(0, text, 5000, 0).ok());
  REQUIRE(rig.kv->grow(0, text, 5001, 0).ok());
  CHECK(rig.kv->stats().used_blocks == 1 + 313);  // nothing leaves a window
  CHECK(rig.kv->seq_bytes(0) == 313 * 6 * kMiB);  // 1,878 MiB against 638 MiB hybrid
  rig.kv->release(0, text);
  rig.check();
}

TEST_CASE("a sliding window hits the cache from the right: evicted front blocks do not matter") {
  // Every layer slides over 8 tokens (Mistral-shaped): one group; blocks of 4 tokens, 2 layers.
  // A hit needs cdiv(8 - 1, 4) = 2 contiguous cached blocks ending the prefix.
  for (const uint32_t window : {8u, 0u}) {
    const ModelShape m = tiny(2, window, 0);
    KvRig rig("{impl: paged_block_pool, block_size: 4}", init_of(m, 20 * 4 * 64));
    REQUIRE(rig.kv->stats().total_blocks == 20);
    const TokenContent a(1, 64), b(2, 128);
    REQUIRE(rig.kv->grow(0, a, 16, 0).ok());
    for (uint32_t n = 17; n <= 32; ++n) REQUIRE(rig.kv->grow(0, a, n, 0).ok());
    // Window 8: computed 31 skips 24 tokens, blocks 0..5 freed (cached), 6 and 7 held.
    CHECK(held(pool(rig).group_table(0, 0)) == (window ? 2 : 8));
    rig.kv->release(0, a.slice(0, 32));
    rig.check();
    // A filler takes the 11 never-used blocks, then the 6 oldest freed ones (window: blocks 0..5
    // of `a`, freed first; full attention: `a`'s blocks 7..2, its tail freed first).
    REQUIRE(rig.kv->grow(1, b, 68, 0).ok());
    CHECK(rig.kv->stats().evicted_blocks == 6);
    rig.kv->release(1, b.slice(0, 68));
    // Window: blocks 6 and 7 are still cached, so 32 tokens hit although blocks 0..5 are gone.
    // Full attention needs every block from 0: blocks 0 and 1 survived, 8 tokens.
    const uint32_t hit = rig.kv->lookup_prefix(a.slice(0, 40));
    CHECK(hit == (window ? 32u : 8u));
    REQUIRE(rig.kv->grow(2, a, hit + 1, hit).ok());
    const std::vector<uint32_t> t = pool(rig).group_table(2, 0);
    REQUIRE(t.size() == hit / 4 + 1);
    // Window: blocks 0..5 are null (skipped: computed 32, 25 tokens before the window).
    CHECK(held(t) == (window ? 3u : hit / 4 + 1));
    rig.kv->release(2, a.slice(0, hit + 1));
    rig.check();
    CHECK(rig.kv->stats().used_blocks == 1);
  }
}

TEST_CASE("hybrid cache hits: the sliding groups' hit bounds the full group's") {
  // 3 layers, the third full: 2 sliding groups and 1 full group of 1 layer (group size 1: 2 is
  // not under 1.5 x 1). Window 8, blocks of 4 tokens: 40 blocks of 128 B.
  const ModelShape m = tiny(3, 8, 3);
  KvRig rig("{impl: paged_block_pool, block_size: 4}", init_of(m, 40 * 4 * 32));
  REQUIRE(pool(rig).groups().size() == 3);
  const TokenContent a(1, 64), b(2, 256);
  REQUIRE(rig.kv->grow(0, a, 16, 0).ok());
  for (uint32_t n = 17; n <= 32; ++n) REQUIRE(rig.kv->grow(0, a, n, 0).ok());
  CHECK(rig.kv->stats().used_blocks == 1 + 8 + 2 * 2);
  rig.kv->release(0, a.slice(0, 32));
  // The LRU queue: 15 never used, the 12 blocks the windows freed, then `a`'s released blocks
  // group by group, tail first. A filler of 27 blocks (9 per group) evicts the first 27.
  REQUIRE(rig.kv->grow(1, b, 36, 0).ok());
  rig.kv->release(1, b.slice(0, 36));
  CHECK(rig.kv->lookup_prefix(a.slice(0, 40)) == 32);  // full: 8 blocks; windows: 6, 7 cached
  CHECK(rig.kv->stats().evicted_blocks == 12);
  // 3 more (one block a group) evict sliding group 0's blocks 7 and 6 and group 1's 7: no run
  // of 2 in both sliding groups, none from block 0: no hit, though the full group holds 8.
  REQUIRE(rig.kv->grow(3, TokenContent(3, 16), 4, 0).ok());
  CHECK(rig.kv->stats().evicted_blocks == 15);
  CHECK(rig.kv->lookup_prefix(a.slice(0, 40)) == 0);
  rig.kv->release(3, TokenContent(3, 4));
  rig.check();
  CHECK(rig.kv->stats().used_blocks == 1);
}

// Gemma-3-12B on the H200 at a fixed KV budget: chunks of 2,048 tokens, prompts of about 3,000
// tokens (16 to 6,000, a quarter of them in 4 shared 1,500-token prefixes).
EngineConfig gemma_engine(const std::string& kv_yaml, uint64_t budget, bool hybrid) {
  EngineConfig e;
  e.model = model_from_configs("gemma-3-12b");
  e.gpu = gpu_from_configs("h200");
  const ConfigNode node = ConfigNode::parse(kv_yaml, "test.yaml");
  e.kv_impl = node["impl"].as_string();
  e.kv_factory = kv_strategies().find(e.kv_impl)->parse(node);
  e.kv_budget_bytes = budget;
  e.serve.max_model_len = 8192;
  e.serve.max_num_batched_tokens = 2048;
  e.hybrid_kv_cache = hybrid;
  e.sample_interval = 50'000'000;
  return e;
}

// `idle_blocks`: what the pool holds with no request (paged_block_pool: the null block).
void require_clean(const ServingResult& r, uint64_t requests, uint64_t idle_blocks = 1) {
  INFO(r.label << ": " << r.error);
  REQUIRE(r.error.empty());  // the engine checked the pool's invariants at the end
  CHECK(r.finished == requests);
  CHECK(r.rejected == 0);
  CHECK(r.kv.used_blocks == idle_blocks);  // every block back in the pool
}

TEST_CASE(
    "serving Gemma-3-12B: the fast decode path equals the step-by-step path, windows "
    "included") {
  const auto reqs = hybrid_long_prompts(200);
  for (const uint64_t budget : {3 * kGiB, 16 * kGiB}) {  // with and without preemption
    EngineConfig e = gemma_engine("{impl: paged_block_pool}", budget, true);
    e.fast_decode = false;
    const ServingResult ref = run_serving(e, reqs);
    e.fast_decode = true;
    const ServingResult fast = run_serving(e, reqs);
    INFO("budget " << budget);
    require_clean(ref, reqs.size());
    require_clean(fast, reqs.size());
    CHECK(fast.sim_time == ref.sim_time);
    CHECK(fast.steps == ref.steps);
    CHECK(fast.counters.preemptions == ref.counters.preemptions);
    CHECK(fast.counters.prefix_hit_tokens == ref.counters.prefix_hit_tokens);
    CHECK(fast.peak_used_blocks == ref.peak_used_blocks);
    CHECK(fast.kv.evicted_blocks == ref.kv.evicted_blocks);
    CHECK(fast.max_running_seqs == ref.max_running_seqs);
    if (budget == 3 * kGiB) CHECK(ref.counters.preemptions > 0);
  }
}

TEST_CASE("serving Gemma-3-12B: hybrid groups against every layer full, and refusals") {
  const auto reqs = hybrid_long_prompts(200);
  const uint64_t budget = 8 * kGiB;
  const ServingResult hybrid =
      run_serving(gemma_engine("{impl: paged_block_pool}", budget, true), reqs);
  const ServingResult full =
      run_serving(gemma_engine("{impl: paged_block_pool}", budget, false), reqs);
  require_clean(hybrid, reqs.size());
  require_clean(full, reqs.size());
  // 8 GiB: 8,192 blocks of 1 MiB (8 layers), 8,191 after the null block, 6 groups: vLLM's
  // 1,365 x 16 tokens; full: 1,365 blocks of 6 MiB, 1,364 x 16.
  CHECK(hybrid.kv.total_blocks == 8192);
  CHECK(hybrid.kv_capacity_tokens == 1365 * 16);
  CHECK(full.kv.total_blocks == 1365);
  CHECK(full.kv_capacity_tokens == 1364 * 16);
  // About the same tokens, but a window group holds at most 65 blocks of a request.
  CHECK(hybrid.max_running_seqs > full.max_running_seqs);
  // A strategy without KV cache groups is refused the hybrid model, served the unified one.
  const ServingResult radix =
      run_serving(gemma_engine("{impl: radix_token_pool}", budget, true), reqs);
  CHECK(radix.error.find("cannot hold KV cache groups with sliding windows") != std::string::npos);
  require_clean(run_serving(gemma_engine("{impl: static_contiguous}", budget, false),
                            hybrid_long_prompts(20)),
                20, 0);
}

TEST_CASE("the KV budget counts blocks of the group size's layers") {
  KvBudgetInput in;
  in.model = model_from_configs("gemma-3-12b");
  in.gpu = gpu_from_configs("h200");
  in.max_num_batched_tokens = 2048;
  in.enforce_eager = true;
  Result<KvBudget> hybrid = compute_kv_budget(in);
  in.hybrid_kv_cache = false;
  Result<KvBudget> full = compute_kv_budget(in);
  REQUIRE(hybrid.ok());
  REQUIRE(full.ok());
  CHECK(hybrid->kv_bytes == full->kv_bytes);  // the bytes do not depend on the grouping
  CHECK(hybrid->kv_block_bytes == kMiB);
  CHECK(full->kv_block_bytes == 6 * kMiB);
  CHECK(hybrid->kv_groups.size() == 6);
  CHECK(full->kv_groups.size() == 1);
  CHECK(hybrid->kv_blocks == hybrid->kv_bytes / kMiB);
  CHECK(full->kv_blocks == full->kv_bytes / (6 * kMiB));
  CHECK(hybrid->kv_tokens == hybrid->kv_blocks / 6 * 16);
  CHECK(full->kv_tokens == full->kv_bytes / (48 * 8 * kKiB));
  CHECK(hybrid->kv_max_blocks_per_request == 512 + 5 * 193);  // max_model_len 8192
  CHECK(full->kv_max_blocks_per_request == 512);
  // A Llama without windows: one group of every layer, the bytes of a block as before.
  in.model = model_from_configs("llama-3.1-8b");
  in.hybrid_kv_cache = true;
  Result<KvBudget> llama = compute_kv_budget(in);
  REQUIRE(llama.ok());
  CHECK(llama->kv_groups.size() == 1);
  CHECK(llama->kv_block_bytes == 16 * llama->kv_bytes_per_token);
}

}  // namespace
}  // namespace memsim::test
