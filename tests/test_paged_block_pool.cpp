// paged_block_pool: the OrinMLLM seed's figures (ch. 16.1, 16.3, 17.5) as exact tests, vLLM's
// free-queue order, prefix caching, copy-on-write and all-or-nothing growth.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "src/kv/paged_block_pool.h"
#include "src/kv/slot_map.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

// The seed's single-sequence PagedKVCacheManager: per-layer blocks, page 16, max length 8192,
// pool sized for one max-length sequence, no prefix caching.
constexpr const char* kSeedPool =
    "{impl: paged_block_pool, block_size: 16, layout: per_layer, prefix_caching: false}";

KvInit seed_init(const ModelShape& m) {
  // One max-length sequence: layers x 8192 tokens x per-layer K+V bytes = the contiguous cache.
  return kv_init_for(m, uint64_t{8192} * m.kv_bytes_per_token(), 1, 8192);
}

TEST_CASE("seed 16.1 and 17.5: Qwen3-8B pool, prefill 35, decode to 48, 63, 64, clear") {
  const ModelShape m = model_from_configs("qwen3-8b");
  REQUIRE(m.layers == 36);
  REQUIRE(m.kv_bytes_per_token() == 2ull * 36 * 1024 * 2);  // KV dim 1024, fp16
  KvRig rig(kSeedPool, seed_init(m));
  KvStats s = rig.kv->stats();
  CHECK(s.total_blocks == 18432);  // 36 x ceil(8192 / 16)
  CHECK(s.free_blocks == 18432);
  CHECK(s.block_bytes == 16 * 1024 * 2 * 2);  // 32 KiB in the key pool + 32 KiB in the value pool
  CHECK(s.pool_bytes == 1152 * kMiB);         // 576 MiB key pool + 576 MiB value pool
  CHECK(s.metadata_bytes == 72 * kKiB);       // block table [36, 512] int32

  const TokenContent chat(7, 8192);
  auto free_after = [&](uint32_t tokens) {
    REQUIRE(rig.kv->grow(0, chat, tokens, 0).ok());
    rig.check();
    return rig.kv->stats().free_blocks;
  };
  CHECK(free_after(35) == 18324);  // prefill: 3 logical blocks x 36 layers
  CHECK(free_after(49) == 18288);  // position 48 enters the 4th logical block
  CHECK(free_after(64) == 18288);  // position 63: still the 4th
  CHECK(free_after(65) == 18252);  // position 64: the 5th
  rig.kv->release(0, chat);
  rig.check();
  CHECK(rig.kv->stats().free_blocks == 18432);  // clear() returns everything
  REQUIRE(rig.kv->shutdown().ok());
  CHECK(rig.backend.usage().physical_bytes == 0);
}

TEST_CASE("seed 16.3: Qwen3-8B usage by conversation length") {
  const ModelShape m = model_from_configs("qwen3-8b");
  struct Row {
    uint32_t tokens, blocks_per_layer;
    uint64_t bytes;
    double percent;
  };
  // 29.3 MB, 141.8 MB and 281.3 MB in the seed are these figures rounded.
  const std::vector<Row> rows = {
      {50, 4, 9 * kMiB, 0.78},
      {200, 13, 29 * kMiB + 256 * kKiB, 2.54},
      {500, 32, 72 * kMiB, 6.25},
      {1000, 63, 141 * kMiB + 768 * kKiB, 12.30},
      {2000, 125, 281 * kMiB + 256 * kKiB, 24.41},
      {4096, 256, 576 * kMiB, 50.00},
      {8192, 512, 1152 * kMiB, 100.00},
  };
  for (const Row& r : rows) {
    KvRig rig(kSeedPool, seed_init(m));
    const TokenContent chat(1, r.tokens);
    REQUIRE(rig.kv->grow(0, chat, r.tokens, 0).ok());
    rig.check();
    const KvStats s = rig.kv->stats();
    INFO(r.tokens);
    CHECK(s.used_blocks == uint64_t{r.blocks_per_layer} * 36);
    CHECK(s.used_blocks * s.block_bytes == r.bytes);
    CHECK(100.0 * s.used_blocks / s.total_blocks == Approx(r.percent).margin(0.005));
  }
}

TEST_CASE("seed 16.1 and 16.3: Qwen2.5-7B pool and a 50-token chat") {
  const ModelShape m = model_from_configs("qwen2.5-7b");
  REQUIRE(m.layers == 28);
  KvRig rig(kSeedPool, seed_init(m));
  CHECK(rig.kv->stats().total_blocks == 14336);
  CHECK(rig.kv->stats().pool_bytes == 448 * kMiB);
  CHECK(rig.kv->stats().metadata_bytes == 56 * kKiB);
  REQUIRE(rig.kv->grow(0, TokenContent(1, 50), 50, 0).ok());
  CHECK(rig.kv->stats().used_blocks == 112);
  CHECK(rig.kv->stats().used_blocks * rig.kv->stats().block_bytes == 3 * kMiB + 512 * kKiB);
}

// A tiny shared-layout pool: 1 null block + `usable` blocks of 16 tokens.
KvInit tiny(uint32_t usable) {
  KvInit i;
  i.layers = 2;
  i.kv_bytes_per_token = 1024;
  i.budget_bytes = uint64_t{usable + 1} * 16 * 1024;
  i.max_num_seqs = 8;
  i.max_model_len = 4096;
  return i;
}

TEST_CASE("free queue: LRU order, a finished request's blocks return tail first") {
  KvRig rig("{impl: paged_block_pool, prefix_caching: false}", tiny(6));
  auto& pool = dynamic_cast<PagedBlockPool&>(*rig.kv);
  const TokenContent a(1, 48), b(2, 16), c(3, 32);
  REQUIRE(pool.grow(1, a, 48, 0).ok());
  CHECK(pool.block_table(1) == std::vector<uint32_t>{1, 2, 3});  // block 0 is the null block
  REQUIRE(pool.grow(2, b, 16, 0).ok());
  CHECK(pool.block_table(2) == std::vector<uint32_t>{4});
  pool.release(1, a);  // queue: 5 6 | 3 2 1
  rig.check();
  REQUIRE(pool.grow(3, c, 32, 0).ok());
  CHECK(pool.block_table(3) == std::vector<uint32_t>{5, 6});
  REQUIRE(pool.grow(4, c, 32, 0).ok());
  CHECK(pool.block_table(4) == std::vector<uint32_t>{3, 2});
  rig.check();
}

// The OrinMLLM seed's free list, a stack (free_list_.pop_back / push_back): a fresh pool hands
// out 0, 1, 2, ... (here 1, 2, 3 after the null block), and an allocation takes the most
// recently freed block: a finished request's blocks return tail first, so the next request gets
// its first block (1) back first.
TEST_CASE("free list: lifo hands out the most recently freed block") {
  KvRig rig("{impl: paged_block_pool, prefix_caching: false, free_list: lifo}", tiny(6));
  auto& pool = dynamic_cast<PagedBlockPool&>(*rig.kv);
  const TokenContent a(1, 48), b(2, 16), c(3, 32);
  REQUIRE(pool.grow(1, a, 48, 0).ok());
  CHECK(pool.block_table(1) == std::vector<uint32_t>{1, 2, 3});
  REQUIRE(pool.grow(2, b, 16, 0).ok());
  CHECK(pool.block_table(2) == std::vector<uint32_t>{4});
  pool.release(1, a);  // stack: 6 5 | 3 2 1 (top)
  rig.check();
  REQUIRE(pool.grow(3, c, 32, 0).ok());
  CHECK(pool.block_table(3) == std::vector<uint32_t>{1, 2});
  REQUIRE(pool.grow(4, c, 32, 0).ok());
  CHECK(pool.block_table(4) == std::vector<uint32_t>{3, 5});
  rig.check();
}

TEST_CASE("prefix caching: chained hashes of full blocks, touch on hit, LRU eviction") {
  KvRig rig("{impl: paged_block_pool}", tiny(6));
  auto& pool = dynamic_cast<PagedBlockPool&>(*rig.kv);
  TokenContent a(10, 32);  // shared system prompt: 2 full blocks
  a.append(11, 8);         // + 8 own tokens
  REQUIRE(pool.lookup_prefix(a) == 0);
  REQUIRE(pool.grow(1, a, 40, 0).ok());
  pool.release(1, a);
  rig.check();
  KvStats s = pool.stats();
  CHECK(s.cached_blocks == 2);  // the partial third block is not cached
  CHECK(s.free_blocks == 4);

  TokenContent b(10, 32);
  b.append(12, 20);  // same system prompt, other question
  CHECK(pool.lookup_prefix(b) == 32);
  REQUIRE(pool.grow(2, b, 52, 32).ok());
  rig.check();
  CHECK(pool.block_table(2) == std::vector<uint32_t>{1, 2, 4, 5});  // hits, then the queue head
  s = pool.stats();
  CHECK(s.cached_blocks == 0);
  CHECK(s.used_blocks == 5);  // 4 + null
  CHECK(s.tokens_stored == 52);

  // A prompt that is exactly the cached prefix recomputes its last token: one block, not two.
  CHECK(pool.lookup_prefix(TokenContent(10, 32)) == 16);
  // Another prefix does not hit.
  CHECK(pool.lookup_prefix(TokenContent(13, 40)) == 0);

  // Eviction: the cached blocks are reused last-in-queue-first-out order: head first.
  pool.release(2, b);  // queue: 6 3 | 5 4 2 1 (tail first); 1, 2, 3 hashed
  rig.check();
  CHECK(pool.stats().cached_blocks == 3);
  REQUIRE(pool.grow(3, TokenContent(14, 64), 64, 0).ok());  // takes 6 3 5 4: evicts 3
  CHECK(pool.block_table(3) == std::vector<uint32_t>{6, 3, 5, 4});
  CHECK(pool.stats().evicted_blocks == 1);
  CHECK(pool.lookup_prefix(b) == 32);  // blocks 1 and 2 survive
  rig.check();
}

TEST_CASE("copy-on-write: fork shares, appending to a shared partial block copies it") {
  KvRig rig("{impl: paged_block_pool}", tiny(8));
  const TokenContent prompt(20, 20);
  REQUIRE(rig.kv->grow(1, prompt, 20, 0).ok());
  REQUIRE(rig.kv->fork(1, 2).ok());
  REQUIRE(rig.kv->fork(1, 3).ok());
  rig.check();
  CHECK(rig.kv->stats().used_blocks == 3);  // shared: 2 blocks + null
  CHECK(rig.kv->stats().tokens_stored == 20);

  TokenContent c2 = prompt, c3 = prompt, c1 = prompt;
  c2.append(22, 5);
  c3.append(23, 5);
  c1.append(21, 5);
  const uint64_t copies_before = rig.backend.calls_of(Primitive::kCopy);
  REQUIRE(rig.kv->grow(2, c2, 21, 0).ok());  // ref 3 -> copy
  REQUIRE(rig.kv->grow(3, c3, 21, 0).ok());  // ref 2 -> copy
  REQUIRE(rig.kv->grow(1, c1, 21, 0).ok());  // sole owner now: in place
  rig.check();
  KvStats s = rig.kv->stats();
  CHECK(s.cow_copies == 2);
  CHECK(s.cow_bytes == 2 * 16 * 1024);
  CHECK(rig.backend.calls_of(Primitive::kCopy) - copies_before == 2);
  CHECK(s.used_blocks == 5);  // full block shared by three, three private tails, null
  CHECK(s.tokens_stored == 16 + 3 * 5);
  REQUIRE(rig.kv->grow(2, c2, 25, 0).ok());  // private now: no copy
  CHECK(rig.kv->stats().cow_copies == 2);
  for (SeqId q : {1u, 2u, 3u}) rig.kv->release(q, q == 1 ? c1 : q == 2 ? c2 : c3);
  rig.check();
  CHECK(rig.kv->stats().used_blocks == 1);
}

TEST_CASE("without copy-on-write, fork copies every block") {
  KvRig rig("{impl: paged_block_pool, copy_on_write: false}", tiny(8));
  const TokenContent prompt(20, 20);
  REQUIRE(rig.kv->grow(1, prompt, 20, 0).ok());
  REQUIRE(rig.kv->fork(1, 2).ok());
  rig.check();
  CHECK(rig.kv->stats().cow_copies == 2);
  CHECK(rig.kv->stats().used_blocks == 5);
  CHECK(rig.kv->stats().tokens_stored == 40);
}

TEST_CASE("growth is all-or-nothing; per-layer blocks count every layer") {
  KvRig rig("{impl: paged_block_pool, prefix_caching: false}", tiny(4));
  const TokenContent a(1, 100);
  REQUIRE(rig.kv->grow(1, a, 40, 0).ok());  // 3 blocks
  const KvStats before = rig.kv->stats();
  const Status s = rig.kv->grow(1, a, 80, 0);  // needs 2 more, 1 free
  REQUIRE(s.error().code == ErrorCode::kOutOfMemory);
  CHECK(s.error().bytes_short == 16 * 1024);
  CHECK(rig.kv->stats().used_blocks == before.used_blocks);
  CHECK(rig.kv->seq_tokens(1) == 40);
  CHECK(rig.kv->grow(1, a, 30, 0).error().code == ErrorCode::kInvalidArgument);  // shrinking
  CHECK(rig.kv->grow(2, a, 5000, 0).error().code == ErrorCode::kInvalidArgument);
  rig.check();

  KvRig layered("{impl: paged_block_pool, layout: per_layer}", tiny(4));
  CHECK(layered.kv->stats().total_blocks == 2 * 5);  // no null block in the per-layer layout
  REQUIRE(layered.kv->grow(1, a, 17, 0).ok());
  CHECK(layered.kv->stats().used_blocks == 4);
  CHECK(layered.kv->stats().block_bytes == 16 * 512);
}

TEST_CASE("SlotMap: any ids, growth past the first table, erase and slot reuse") {
  SlotMap<std::vector<uint32_t>> m;
  CHECK(m.find(7) == nullptr);
  for (uint32_t i = 0; i < 1000; ++i) m.insert(i * 2654435761u, {i});  // spread over uint32
  CHECK(m.size() == 1000);
  for (uint32_t i = 0; i < 1000; i += 2) m.erase(i * 2654435761u);
  m.erase(12345);  // absent: nothing happens
  CHECK(m.size() == 500);
  for (uint32_t i = 0; i < 1000; ++i) {
    const std::vector<uint32_t>* v = m.find(i * 2654435761u);
    REQUIRE((v != nullptr) == (i % 2 == 1));
    if (v) CHECK(*v == std::vector<uint32_t>{i});
  }
  m.insert(UINT32_MAX, {1, 2});  // reuses a freed slot
  CHECK(*m.find(UINT32_MAX) == std::vector<uint32_t>{1, 2});
  uint64_t seen = 0;
  CHECK(m.all([&](uint32_t, const std::vector<uint32_t>&) { return ++seen < 10; }) == false);
  CHECK(seen == 10);
  m.clear();
  CHECK(m.size() == 0);
  CHECK(m.find(UINT32_MAX) == nullptr);
}

TEST_CASE("config: block sizes are vLLM's") {
  CHECK_THROWS_WITH(make_kv("{impl: paged_block_pool, block_size: 12}"),
                    Catch::Contains("test.yaml:1") && Catch::Contains("block_size") &&
                        Catch::Contains("1, 8, 16, 32, 64, 128, 256"));
  CHECK_THROWS_WITH(make_kv("{impl: paged_block_pool, layout: per_layers}"),
                    Catch::Contains("per_layer"));
}

}  // namespace
}  // namespace memsim::test
