// paged_block_pool: the OrinMLLM seed's figures (ch. 16.1, 16.3, 17.5) as exact tests, vLLM's
// free-queue order, prefix caching, copy-on-write and all-or-nothing growth.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

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
  // Two allocations of 576 MiB: the key pool and the value pool [18432, 16, 1024] fp16 (1.3).
  CHECK(rig.backend.calls_of(Primitive::kDeviceMalloc) == 2);
  CHECK(rig.backend.usage().physical_bytes == 1152 * kMiB);
  const KvLayout layout = rig.kv->layout();
  CHECK(layout.v[0] - layout.k[0] == 576 * kMiB);
  CHECK(layout.k[1] - layout.k[0] == 16 * 1024 * 2);  // layer 1's block: the next physical one
  CHECK(layout.block_stride == 36 * 16 * 1024 * 2);   // a table entry steps over 36 of them

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

// Seed 17.4: the block table of a 50-token chat on Qwen3-8B, one row per layer.
TEST_CASE("seed 17.4: Qwen3-8B block table rows per layer after 50 tokens") {
  const ModelShape m = model_from_configs("qwen3-8b");
  KvRig rig(kSeedPool, seed_init(m));
  auto& pool = dynamic_cast<PagedBlockPool&>(*rig.kv);
  REQUIRE(pool.grow(0, TokenContent(7, 50), 50, 0).ok());
  rig.check();
  CHECK(pool.layer_table(0, 0) == std::vector<uint32_t>{0, 36, 72, 108});
  CHECK(pool.layer_table(0, 1) == std::vector<uint32_t>{1, 37, 73, 109});
  CHECK(pool.layer_table(0, 2) == std::vector<uint32_t>{2, 38, 74, 110});
  CHECK(pool.layer_table(0, 35) == std::vector<uint32_t>{35, 71, 107, 143});
  CHECK(pool.stats().free_blocks == 18288);  // "Free blocks remaining: 18288 / 18432"
  // Row 1 of logical block 2 holds token 32's K in layer 1 at physical block 73 of the key pool.
  const KvLayout layout = pool.layout();
  std::vector<int32_t> table;
  pool.seq_table(0, &table);
  CHECK(layout.row(table, false, 1, 32) == layout.k[0] + 73ull * 16 * 2048);
  CHECK(layout.row(table, true, 1, 33) == layout.v[0] + 73ull * 16 * 2048 + 2048);
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

// Seed 6.1.2 (factor 2) and 6.1.3: the Qwen3-8B block table [36, 8192 / block size] int32 per
// block size, 4 to 128; block size 4 holds 4 tokens of 1,024 fp16 values per layer in each pool.
TEST_CASE("seed 6.1: Qwen3-8B block tables per block size, 4 to 128") {
  const ModelShape m = model_from_configs("qwen3-8b");
  struct Row {
    uint32_t block_size;
    uint64_t table_bytes, blocks;
  };
  const std::vector<Row> rows = {{4, 288 * kKiB, 73728},  {8, 144 * kKiB, 36864},
                                 {16, 72 * kKiB, 18432},  {32, 36 * kKiB, 9216},
                                 {64, 18 * kKiB, 4608},   {128, 9 * kKiB, 2304},
                                 {1, 1152 * kKiB, 294912}};
  for (const Row& r : rows) {
    INFO(r.block_size);
    KvRig rig(fmt::format("{{impl: paged_block_pool, block_size: {}, layout: per_layer, "
                          "prefix_caching: false}}",
                          r.block_size),
              seed_init(m));
    const KvStats s = rig.kv->stats();
    CHECK(s.metadata_bytes == r.table_bytes);
    CHECK(s.total_blocks == r.blocks);
    CHECK(s.block_bytes == uint64_t{r.block_size} * 1024 * 2 * 2);  // K and V of one layer
    CHECK(s.pool_bytes == 1152 * kMiB);  // the same pool whatever the block size (16.2)
  }
  // Block size 4: a 35-token prefill takes 9 logical blocks per layer, 1 token of waste each.
  KvRig rig("{impl: paged_block_pool, block_size: 4, layout: per_layer, prefix_caching: false}",
            seed_init(m));
  REQUIRE(rig.kv->grow(0, TokenContent(7, 64), 35, 0).ok());
  rig.check();
  const KvStats s = rig.kv->stats();
  CHECK(s.used_blocks == 9 * 36);
  CHECK(s.slots_allocated == 36);  // per logical block: one token of waste
  CHECK(s.tokens_stored == 35);
  CHECK(dynamic_cast<PagedBlockPool&>(*rig.kv).block_table(0) ==
        std::vector<uint32_t>{0, 36, 72, 108, 144, 180, 216, 252, 288});
}

// Seed 16.7, extra overhead of the paged cache for Qwen3-8B (per-layer blocks of 16, one sequence
// of 8,192 tokens): the block table on the GPU (72 KiB), its copy on the CPU (72 KiB) and the
// free list, 18,432 blocks x 4 bytes (73,728 bytes, the seed's "~74 KB"): 221,184 bytes in all,
// the seed's "~218 KB" (72 + 72 + 74, KiB and kB mixed). The seed's two 1-element placeholder
// buffers (~4 bytes) are not modelled.
TEST_CASE("seed 16.7: Qwen3-8B extra overhead, tables on CPU and GPU plus the free list") {
  const ModelShape m = model_from_configs("qwen3-8b");
  KvRig rig(kSeedPool, seed_init(m));
  const KvStats s = rig.kv->stats();
  CHECK(s.metadata_bytes == 73728);
  CHECK(s.host_table_bytes == 73728);
  CHECK(s.free_list_bytes == 73728);
  CHECK(s.overhead_bytes() == 221184);
  // Qwen2.5-7B: 56 KiB tables and 14,336 blocks: 172,032 bytes.
  KvRig qwen25(kSeedPool, seed_init(model_from_configs("qwen2.5-7b")));
  CHECK(qwen25.kv->stats().overhead_bytes() == 3 * 57344);
  // A vLLM-shaped pool: tables for every sequence slot, one free-list entry per block.
  KvRig shared("{impl: paged_block_pool}", tiny(8));  // 9 blocks, 8 rows of 256 entries
  CHECK(shared.kv->stats().metadata_bytes == 8 * 256 * 4);
  CHECK(shared.kv->stats().free_list_bytes == 9 * 4);
}

// Seed 10.4 strategy 4 on the seed's Qwen3-8B pools (per-layer blocks of 16, a logical block of
// 36 layers is 1.125 MiB in the key pool and as much in the value pool, the cap 18,432 blocks =
// 512 logical blocks): 144 blocks (4 logical, 4.5 MiB a pool, mapped as 3 granules of 2 MiB: 12
// MiB) at init, 144 more each time the pool runs dry, each pool growing by the same granules.
TEST_CASE("a growing pool: 144 blocks at init, 144 more when exhausted, up to the cap") {
  const ModelShape m = model_from_configs("qwen3-8b");
  KvRig rig(
      "{impl: paged_block_pool, layout: per_layer, prefix_caching: false, initial_blocks: 144, "
      "grow_blocks: 144}",
      seed_init(m));
  auto stats = [&] {
    rig.check();  // physical bytes = pool_bytes, blocks conserved
    return rig.kv->stats();
  };
  KvStats s = stats();
  CHECK(s.total_blocks == 144);
  CHECK(s.max_blocks == 18432);
  CHECK(s.pool_bytes == 12 * kMiB);
  CHECK(rig.kv->free_token_capacity() == 8192);  // the headroom counts: the pool may grow
  const TokenContent chat(7, 8192);
  REQUIRE(rig.kv->grow(0, chat, 64, 0).ok());  // 4 logical blocks: no growth
  s = stats();
  CHECK(s.used_blocks == 144);
  CHECK(s.free_blocks == 0);
  CHECK(s.pool_growths == 0);
  REQUIRE(rig.kv->grow(0, chat, 65, 0).ok());  // the 5th: 8 logical blocks, 9 -> 10 MiB a pool
  s = stats();
  CHECK(s.total_blocks == 288);
  CHECK(s.pool_bytes == 20 * kMiB);
  CHECK(s.pool_growths == 1);
  CHECK(s.used_blocks == 180);
  REQUIRE(rig.kv->grow(0, chat, 200, 0).ok());  // 13 logical blocks: 12 (2 x 14 MiB), then 16
  s = stats();
  CHECK(s.total_blocks == 576);
  CHECK(s.pool_bytes == 36 * kMiB);
  CHECK(s.pool_growths == 3);
  // Init and 3 growths, in each of the two pools.
  CHECK(rig.backend.calls_of(Primitive::kCreatePhysical) == 8);
  CHECK(rig.backend.calls_of(Primitive::kMap) == 8);
  CHECK(rig.backend.calls_of(Primitive::kSetAccess) == 8);
  REQUIRE(rig.kv->grow(0, chat, 8192, 0).ok());  // 512 logical blocks: 124 growths more
  s = stats();
  CHECK(s.total_blocks == 18432);
  CHECK(s.pool_bytes == 1152 * kMiB);  // the whole pool of seed 16.1, 128 growths later
  CHECK(s.pool_growths == 127);
  CHECK(rig.kv->free_token_capacity() == 0);
  // At the cap the pool is exhausted for good: one logical block short.
  const Status full = rig.kv->grow(1, chat, 1, 0);
  REQUIRE(full.error().code == ErrorCode::kOutOfMemory);
  CHECK(full.error().bytes_short == 2304 * kKiB);
  rig.kv->release(0, chat);
  CHECK(stats().free_blocks == 18432);  // it never shrinks
  REQUIRE(rig.kv->shutdown().ok());
  CHECK(rig.backend.usage().physical_bytes == 0);
  CHECK(rig.backend.usage().virtual_reserved == 0);
}

// The growth takes physical memory from the backend: on a GPU of 20 MiB the pools of 2 x 6 MiB
// grow to 2 x 10 MiB, and the next growth (2 x 14 MiB) runs the GPU out of memory at the key
// pool's 4 MiB; nothing grows, and the sequence keeps what it held.
TEST_CASE("a growing pool runs the GPU out of memory for real") {
  const ModelShape m = model_from_configs("qwen3-8b");
  SimClock clock;
  GpuSpec gpu = kv_test_gpu();
  gpu.capacity = 20 * kMiB;
  SimBackend backend(gpu, clock);
  auto kv = make_kv(
      "{impl: paged_block_pool, layout: per_layer, prefix_caching: false, initial_blocks: 144}");
  REQUIRE(kv->init(backend, seed_init(m)).ok());
  const TokenContent chat(7, 8192);
  REQUIRE(kv->grow(0, chat, 128, 0).ok());
  CHECK(backend.usage().physical_bytes == 20 * kMiB);
  const Status st = kv->grow(0, chat, 129, 0);
  REQUIRE(st.error().code == ErrorCode::kOutOfMemory);
  CHECK(st.error().bytes_short == 4 * kMiB);
  CHECK(kv->seq_tokens(0) == 128);
  CHECK(kv->stats().total_blocks == 288);
  CHECK(backend.usage().physical_bytes == 20 * kMiB);
  std::string why;
  CHECK(kv->check_invariants(&why));
  REQUIRE(kv->shutdown().ok());
  CHECK(backend.usage().physical_bytes == 0);
}

TEST_CASE("config: a growing pool's keys") {
  CHECK_THROWS_WITH(make_kv("{impl: paged_block_pool, grow_blocks: 16}"),
                    Catch::Contains("grow_blocks") && Catch::Contains("needs initial_blocks"));
  CHECK_THROWS_WITH(make_kv("{impl: paged_block_pool, initial_blocks: 0}"),
                    Catch::Contains("initial_blocks") && Catch::Contains("positive"));
  CHECK_THROWS_WITH(make_kv("{impl: paged_block_pool, inital_blocks: 8}"),
                    Catch::Contains("initial_blocks"));
  SimClock clock;
  SimBackend backend(kv_test_gpu(), clock);
  auto kv = make_kv("{impl: paged_block_pool, layout: per_layer, initial_blocks: 100}");
  const Status st = kv->init(backend, seed_init(model_from_configs("qwen3-8b")));
  REQUIRE(st.error().code == ErrorCode::kInvalidArgument);
  CHECK_THAT(st.error().message, Catch::Contains("multiples of the 36 layers"));
  auto over = make_kv("{impl: paged_block_pool, initial_blocks: 100}");
  const Status big = over->init(backend, tiny(8));  // 9 blocks at most
  REQUIRE(big.error().code == ErrorCode::kInvalidArgument);
  CHECK_THAT(big.error().message, Catch::Contains("not between 2 and the 9 blocks"));
}

// Seed 10.4 strategy 3: a long sequence gives up its earliest blocks, and its next grow takes
// them back (the caller recomputes their KV). Pool: the null block and blocks 1..8 of 16 tokens.
TEST_CASE("release_front frees a sequence's earliest blocks; its next grow restores them") {
  KvRig rig("{impl: paged_block_pool, prefix_caching: false}", tiny(8));
  auto& pool = dynamic_cast<PagedBlockPool&>(*rig.kv);
  const TokenContent a(1, 200), b(2, 20);
  REQUIRE(pool.grow(1, a, 100, 0).ok());  // blocks 1..7, block 8 free
  const Status short_one = pool.grow(2, b, 20, 0);
  REQUIRE(short_one.error().code == ErrorCode::kOutOfMemory);
  CHECK(short_one.error().bytes_short == 16 * kKiB);
  CHECK(pool.release_front(1, 16 * kKiB, 4096) == 16);  // block 1 (tokens 0..15)
  rig.check();
  constexpr uint32_t kGone = UINT32_MAX;
  CHECK(pool.block_table(1) == std::vector<uint32_t>{kGone, 2, 3, 4, 5, 6, 7});
  std::vector<int32_t> table;
  pool.seq_table(1, &table);
  CHECK(table == std::vector<int32_t>{-1, 2, 3, 4, 5, 6, 7});
  CHECK(pool.front_gap(1) == 16);
  CHECK(pool.seq_tokens(1) == 100);
  CHECK(pool.seq_bytes(1) == 6 * 16 * kKiB);
  CHECK(pool.seq_capacity(1) == 0);
  CHECK(pool.fork(1, 3).error().code == ErrorCode::kInvalidArgument);
  REQUIRE(pool.grow(2, b, 20, 0).ok());  // blocks 8 and 1
  CHECK(pool.block_table(2) == std::vector<uint32_t>{8, 1});
  CHECK(pool.release_front(1, 32 * kKiB, 32) == 32);      // at most 32 tokens: block 2 only
  CHECK(pool.release_front(1, 1024 * kKiB, 4096) == 96);  // blocks 3..6; never the last, 7
  CHECK(pool.stats().free_blocks == 5);
  CHECK(pool.stats().tokens_stored == 100 - 96 + 20);
  rig.check();
  const Status too_many = pool.grow(1, a, 101, 0);  // 6 blocks back, 5 free
  REQUIRE(too_many.error().code == ErrorCode::kOutOfMemory);
  CHECK(too_many.error().bytes_short == 16 * kKiB);
  CHECK(pool.front_gap(1) == 96);
  pool.release(2, b);  // free queue: 2, 3, 4, 5, 6, 1, 8
  REQUIRE(pool.grow(1, a, 101, 0).ok());
  rig.check();
  CHECK(pool.block_table(1) == std::vector<uint32_t>{2, 3, 4, 5, 6, 1, 7});
  CHECK(pool.front_gap(1) == 0);
  CHECK(pool.seq_capacity(1) == 112);
  CHECK(pool.stats().tokens_stored == 101);
  CHECK(pool.stats().free_blocks == 1);

  // Blocks a fork shares are dropped but free nothing: the front of 40 tokens shared with
  // sequence 3 goes, and no block comes free.
  KvRig shared("{impl: paged_block_pool, prefix_caching: false}", tiny(8));
  REQUIRE(shared.kv->grow(1, a, 40, 0).ok());
  REQUIRE(shared.kv->fork(1, 3).ok());
  CHECK(shared.kv->release_front(1, 16 * kKiB, 4096) == 32);
  CHECK(shared.kv->stats().free_blocks == 5);
  CHECK(dynamic_cast<PagedBlockPool&>(*shared.kv).block_table(3) == std::vector<uint32_t>{1, 2, 3});
  shared.check();
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

// Seed 6.2.4 and 6.3 on Qwen3-8B with per-layer blocks: "Hello world" (2 tokens) forked, then
// each sequence writes position 2. The first write copies the shared block of every layer (the
// seed's cow_on_write, K and V: block_size x 1,024 x 2 bytes per layer and pool, 16 / 32 / 64 /
// 128 KiB at block sizes 8 / 16 / 32 / 64); the second finds its block private. memsim copies
// a logical block's 36 layer blocks, adjacent in each pool, in two Backend::copy calls (the key
// pool's, the value pool's); on a GPU whose copy costs 4 us a call plus 64 KiB a microsecond
// read and written (2 x bytes), that takes 2 x (4 + 2 x 36 x block_size x 2 KiB / 64 KiB) =
// 8 + 4.5 x block_size us.
TEST_CASE("copy-on-write cost per block size, 8 to 64 (seed 6.2.6, 6.3)") {
  const ModelShape m = model_from_configs("qwen3-8b");
  struct Row {
    uint32_t block_size;
    uint64_t per_layer_pool_bytes, bytes;
    SimTime ns;
  };
  const std::vector<Row> rows = {{8, 16 * kKiB, 1152 * kKiB, 44000},
                                 {16, 32 * kKiB, 2304 * kKiB, 80000},
                                 {32, 64 * kKiB, 4608 * kKiB, 152000},
                                 {64, 128 * kKiB, 9216 * kKiB, 296000}};
  for (const Row& r : rows) {
    INFO(r.block_size);
    SimClock clock;
    GpuSpec gpu = kv_test_gpu();
    gpu.cost(Primitive::kCopy).per_call_us = 4;
    gpu.cost(Primitive::kCopy).bytes_per_us = 64 * 1024;
    SimBackend backend(gpu, clock);
    auto kv = make_kv(fmt::format(
        "{{impl: paged_block_pool, block_size: {}, layout: per_layer, prefix_caching: false}}",
        r.block_size));
    REQUIRE(kv->init(backend, seed_init(m)).ok());
    TokenContent seq0(1, 2), seq1(1, 2);  // "Hello world"
    seq0.append(3, 1);                    // "How"
    seq1.append(4, 1);                    // "Why"
    REQUIRE(kv->grow(0, seq0, 2, 0).ok());
    REQUIRE(kv->fork(0, 1).ok());
    const SimTime before = backend.time_in(Primitive::kCopy);
    REQUIRE(kv->grow(0, seq0, 3, 0).ok());  // ref 2: copy, then write
    const SimTime copy_ns = backend.time_in(Primitive::kCopy) - before;
    REQUIRE(kv->grow(1, seq1, 3, 0).ok());  // ref 1 now: written in place
    const KvStats s = kv->stats();
    CHECK(s.block_bytes / 2 == r.per_layer_pool_bytes);  // one layer's K (or V) of a block
    CHECK(s.cow_copies == 36);                           // one physical block per layer
    CHECK(s.cow_bytes == r.bytes);
    CHECK(s.cow_bytes == 36 * 2 * r.per_layer_pool_bytes);
    CHECK(copy_ns == r.ns);
    CHECK(backend.time_in(Primitive::kCopy) - before == r.ns);  // the second write copied nothing
    CHECK(s.used_blocks == 2 * 36);
    std::string why;
    CHECK(kv->check_invariants(&why));
  }
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

TEST_CASE("config: block sizes are vLLM's and the seed's 4") {
  CHECK_THROWS_WITH(make_kv("{impl: paged_block_pool, block_size: 12}"),
                    Catch::Contains("test.yaml:1") && Catch::Contains("block_size") &&
                        Catch::Contains("1, 4, 8, 16, 32, 64, 128, 256"));
  CHECK_THROWS_WITH(make_kv("{impl: paged_block_pool, block_size: 2}"),
                    Catch::Contains("block size 2"));
  CHECK(make_kv("{impl: paged_block_pool, block_size: 4}")->block_table_tokens() == 4);
  CHECK_THROWS_WITH(make_kv("{impl: paged_block_pool, layout: per_layers}"),
                    Catch::Contains("per_layer"));
}

}  // namespace
}  // namespace memsim::test
