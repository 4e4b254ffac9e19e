// radix_token_pool: exact pool sizes, prefix hits, node splits, LRU/LFU eviction order, lock
// protection, release dedup, fork sharing, disabled cache, all-or-nothing growth, teardown.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "src/kv/radix_token_pool.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

constexpr uint64_t kTokenBytes = 1024;  // a toy geometry: 1 KiB of KV per token

// A pool of exactly `pages` usable pages (plus SGLang's padding page) of the toy geometry.
KvInit toy_init(uint32_t pages, uint32_t page_size) {
  KvInit i;
  i.layers = 1;
  i.kv_bytes_per_token = kTokenBytes;
  i.budget_bytes = uint64_t{pages + 1} * page_size * kTokenBytes;
  i.max_num_seqs = 8;
  i.max_model_len = 4096;
  return i;
}

std::string yaml(uint32_t page_size, const std::string& extra = "") {
  return "{impl: radix_token_pool, page_size: " + std::to_string(page_size) + extra + "}";
}

RadixTokenPool& pool(KvRig& rig) {
  return dynamic_cast<RadixTokenPool&>(*rig.kv);
}

TokenContent two_streams(uint64_t a, uint32_t na, uint64_t b, uint32_t nb) {
  TokenContent c(a, na);
  c.append(b, nb);
  return c;
}

// Grows a new sequence from its cached prefix, checking the invariants.
void admit(KvRig& rig, SeqId seq, const TokenContent& c, uint32_t tokens) {
  const uint32_t prefix = std::min(rig.kv->lookup_prefix(c), tokens);
  REQUIRE(rig.kv->grow(seq, c, tokens, prefix).ok());
  rig.check();
}

void finish(KvRig& rig, SeqId seq, const TokenContent& c) {
  rig.kv->release(seq, c);
  rig.check();
}

ErrorCode code(const Status& s) {
  REQUIRE_FALSE(s.ok());
  return s.error().code;
}

bool same_stats(const KvStats& a, const KvStats& b) {
  return a.total_blocks == b.total_blocks && a.used_blocks == b.used_blocks &&
         a.cached_blocks == b.cached_blocks && a.free_blocks == b.free_blocks &&
         a.slots_allocated == b.slots_allocated && a.tokens_stored == b.tokens_stored &&
         a.pool_bytes == b.pool_bytes && a.cow_copies == b.cow_copies &&
         a.evicted_blocks == b.evicted_blocks;
}

TEST_CASE("pool size from the budget: SGLang max_total_num_tokens in pages, padding page") {
  SECTION("Llama-3.1-8B, 10 GiB, page 1 and 16") {
    const ModelShape m = model_from_configs("llama-3.1-8b");
    REQUIRE(m.kv_bytes_per_token() == 128 * kKiB);
    const KvInit init = kv_init_for(m, 10 * kGiB, 256, 8192);
    KvRig one(yaml(1), init);
    KvStats s = one.kv->stats();
    CHECK(s.block_tokens == 1);
    CHECK(s.block_bytes == 128 * kKiB);
    CHECK(s.total_blocks == 81919);  // 10 GiB / 128 KiB = 81920 pages, minus padding page 0
    CHECK(s.free_blocks == 81919);
    CHECK(s.pool_bytes == 10 * kGiB);
    CHECK(s.metadata_bytes == 256ull * (8192 + 4) * 4);  // req_to_token int32 [256, 8196]
    CHECK(one.kv->free_token_capacity() == 81919);
    one.check();
    KvRig paged(yaml(16), init);
    s = paged.kv->stats();
    CHECK(s.block_tokens == 16);
    CHECK(s.block_bytes == 2 * kMiB);
    CHECK(s.total_blocks == 5119);
    CHECK(paged.kv->free_token_capacity() == 5119 * 16);
    REQUIRE(paged.kv->shutdown().ok());
    CHECK(paged.backend.usage().physical_bytes == 0);
    CHECK(paged.kv->stats().pool_bytes == 0);
  }
  SECTION("Qwen2.5-7B, 1 GiB: the allocation rounds up to the 2 MiB granularity") {
    const ModelShape m = model_from_configs("qwen2.5-7b");
    REQUIRE(m.kv_bytes_per_token() == 57344);  // 2 x 28 layers x 4 kv heads x 128 x 2 bytes
    KvRig rig(yaml(1), kv_init_for(m, kGiB, 64, 32768));
    const KvStats s = rig.kv->stats();
    CHECK(s.total_blocks == 18723);  // floor(2^30 / 57344) = 18724 pages, one is padding
    CHECK(s.pool_bytes == kGiB);     // 18724 x 57344 = 1073709056 bytes, 2 MiB-rounded
    CHECK(rig.backend.usage().per_tag.at("kv_cache") == kGiB);
    KvRig paged(yaml(16), kv_init_for(m, kGiB, 64, 32768));
    CHECK(paged.kv->stats().total_blocks == 1169);  // floor(2^30 / 917504) = 1170, minus 1
  }
  SECTION("a budget without room for the padding page and one page is out of memory") {
    SimClock clock;
    SimBackend backend(kv_test_gpu(), clock);
    auto kv = make_kv(yaml(4));
    KvInit init = toy_init(1, 4);
    init.budget_bytes -= 1;
    const Status s = kv->init(backend, init);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().code == ErrorCode::kOutOfMemory);
    CHECK(s.error().bytes_short == 1);
    CHECK(backend.usage().physical_bytes == 0);
  }
}

TEST_CASE("prefix hits, page size 1: capped at size - 1, split where a prompt diverges") {
  KvRig rig(yaml(1), toy_init(1000, 1));
  const TokenContent a(1, 100);
  admit(rig, 0, a, 100);
  CHECK(rig.kv->lookup_prefix(a) == 0);  // nothing cached while A runs
  finish(rig, 0, a);
  CHECK(pool(rig).tree().node_count() == 2);  // root + [0, 100)
  CHECK(rig.kv->stats().cached_blocks == 100);
  CHECK(rig.kv->lookup_prefix(a) == 99);  // the last token is always recomputed
  CHECK(rig.kv->lookup_prefix(TokenContent(1, 30)) == 29);
  CHECK(rig.kv->lookup_prefix(TokenContent(1, 250)) == 100);
  CHECK(rig.kv->lookup_prefix(TokenContent(3, 50)) == 0);
  const TokenContent b = two_streams(1, 60, 2, 40);
  CHECK(rig.kv->lookup_prefix(b) == 60);
  // lookup_prefix has no side effects: no split yet.
  CHECK(pool(rig).tree().node_count() == 2);

  REQUIRE(rig.kv->grow(1, b, 100, 60).ok());  // takes the prefix: [0, 100) splits at 60
  rig.check();
  CHECK(pool(rig).tree().node_count() == 3);
  CHECK(pool(rig).seq_cached_tokens(1) == 60);
  KvStats s = rig.kv->stats();
  CHECK(s.used_blocks == 100);   // 60 shared through the tree + 40 private
  CHECK(s.cached_blocks == 40);  // A's [60, 100) stays evictable
  CHECK(s.free_blocks == 860);
  CHECK(s.tokens_stored == 100);
  CHECK(rig.kv->seq_bytes(1) == 100 * kTokenBytes);
  finish(rig, 1, b);  // B's [60, 100) becomes a sibling of A's
  CHECK(pool(rig).tree().node_count() == 4);
  s = rig.kv->stats();
  CHECK(s.used_blocks == 0);
  CHECK(s.cached_blocks == 140);
  CHECK(s.free_blocks == 860);
  CHECK(rig.kv->lookup_prefix(b) == 99);
  CHECK(rig.kv->lookup_prefix(two_streams(1, 60, 4, 10)) == 60);
}

TEST_CASE("prefix hits, page size 16: whole pages only, the tail page is freed") {
  KvRig rig(yaml(16), toy_init(100, 16));
  const TokenContent a(1, 100);
  admit(rig, 0, a, 100);
  CHECK(rig.kv->stats().used_blocks == 7);  // ceil(100 / 16)
  CHECK(rig.kv->stats().tokens_stored == 100);
  finish(rig, 0, a);
  KvStats s = rig.kv->stats();
  CHECK(s.cached_blocks == 6);  // [0, 96) in the tree; the page of tokens 96..99 is freed
  CHECK(s.free_blocks == 94);
  CHECK(rig.kv->lookup_prefix(TokenContent(1, 200)) == 96);
  CHECK(rig.kv->lookup_prefix(TokenContent(1, 97)) == 96);
  CHECK(rig.kv->lookup_prefix(TokenContent(1, 96)) == 80);  // capped at 95, page-aligned
  CHECK(rig.kv->lookup_prefix(two_streams(1, 60, 2, 40)) == 48);
  CHECK(rig.kv->lookup_prefix(TokenContent(1, 16)) == 0);

  const TokenContent b = two_streams(1, 60, 2, 40);
  REQUIRE(rig.kv->grow(1, b, 100, 48).ok());  // the edge of 6 pages splits after page 3
  rig.check();
  CHECK(pool(rig).tree().node_count() == 3);
  s = rig.kv->stats();
  CHECK(s.used_blocks == 3 + 4);  // 3 shared + ceil(52 / 16) private
  CHECK(s.cached_blocks == 3);
  CHECK(s.tokens_stored == 48 + 52);
  CHECK(rig.kv->seq_bytes(1) == 7 * 16 * kTokenBytes);
  CHECK(code(rig.kv->grow(1, b, 100, 16)) == ErrorCode::kInvalidArgument);  // prefix + live seq
  CHECK(code(rig.kv->grow(1, b, 90, 0)) == ErrorCode::kInvalidArgument);    // shrinking
  SECTION("a prefix that is not page-aligned or not cached is rejected") {
    CHECK(code(rig.kv->grow(2, a, 100, 40)) == ErrorCode::kInvalidArgument);
    CHECK(code(rig.kv->grow(2, TokenContent(9, 100), 100, 16)) == ErrorCode::kInvalidArgument);
    rig.check();
  }
}

TEST_CASE("release inserts its tokens; duplicates of cached pages are freed") {
  for (uint32_t ps : {1u, 16u}) {
    INFO("page_size " << ps);
    KvRig rig(yaml(ps), toy_init(200, ps));
    const TokenContent c(5, 50);
    admit(rig, 0, c, 50);
    admit(rig, 1, c, 50);  // admitted before A finished: no prefix, its own pages
    const uint64_t per_seq = (50 + ps - 1) / ps;
    CHECK(rig.kv->stats().used_blocks == 2 * per_seq);
    finish(rig, 0, c);
    const uint64_t full = 50 / ps;
    CHECK(rig.kv->stats().cached_blocks == full);
    finish(rig, 1, c);  // all of B's full pages are duplicates
    const KvStats s = rig.kv->stats();
    CHECK(s.cached_blocks == full);
    CHECK(s.used_blocks == 0);
    CHECK(s.free_blocks == 200 - full);
    CHECK(pool(rig).tree().node_count() == 2);
  }
}

TEST_CASE("release inserts only the tokens its content covers (the KV that was computed)") {
  for (uint32_t ps : {1u, 4u}) {
    INFO("page_size " << ps);
    KvRig rig(yaml(ps), toy_init(200, ps));
    const TokenContent c(3, 40);
    admit(rig, 0, c, 40);  // grown for 40 tokens, none computed (a swap-in undone)
    finish(rig, 0, c.slice(0, 0));
    KvStats s = rig.kv->stats();
    CHECK(s.cached_blocks == 0);
    CHECK(s.free_blocks == 200);
    CHECK(pool(rig).tree().node_count() == 1);
    CHECK(rig.kv->lookup_prefix(c) == 0);
    admit(rig, 1, c, 40);  // grown for 40, 18 computed: the full pages of [0, 18) stay
    finish(rig, 1, c.slice(0, 18));
    s = rig.kv->stats();
    CHECK(s.cached_blocks == 18 / ps);
    CHECK(s.free_blocks == 200 - 18 / ps);
    CHECK(rig.kv->lookup_prefix(c) == 18 / ps * ps);
  }

  SECTION("a fork keeps the parent's own pages, not unwritten ones of a released sequence") {
    KvRig rig(yaml(1), toy_init(200, 1));
    const TokenContent c(3, 40);
    admit(rig, 0, c, 40);
    const std::vector<uint32_t> unwritten = pool(rig).page_table(0);
    finish(rig, 0, c.slice(0, 0));
    REQUIRE(rig.kv->grow(1, c, 40, 0).ok());  // regrown from scratch, its KV written
    const std::vector<uint32_t> own = pool(rig).page_table(1);
    REQUIRE(own.size() == 40);
    CHECK(std::find_first_of(own.begin(), own.end(), unwritten.begin(), unwritten.end()) ==
          own.end());
    REQUIRE(rig.kv->fork(1, 2).ok());  // cache_unfinished_req of seq 1
    rig.check();
    CHECK(pool(rig).page_table(1) == own);
    CHECK(pool(rig).page_table(2) == own);
    CHECK(rig.kv->stats().free_blocks == 200 - 40);
  }
}

TEST_CASE("eviction takes least recently used leaves first, whole nodes") {
  KvRig rig(yaml(1), toy_init(10, 1));
  const TokenContent x(10, 4), y(11, 3), z(12, 3);
  admit(rig, 0, TokenContent(10, 3), 3);
  finish(rig, 0, TokenContent(10, 3));
  admit(rig, 1, y, 3);
  finish(rig, 1, y);
  admit(rig, 2, z, 3);
  finish(rig, 2, z);
  CHECK(rig.kv->stats().cached_blocks == 9);
  // W reuses X (touching it), then finishes with one more token of X's stream.
  CHECK(rig.kv->lookup_prefix(x) == 3);
  REQUIRE(rig.kv->grow(3, x, 4, 3).ok());
  rig.check();
  CHECK(rig.kv->stats().free_blocks == 0);
  finish(rig, 3, x);
  CHECK(rig.kv->stats().cached_blocks == 10);
  const RadixTree& tree = pool(rig).tree();
  CHECK(tree.pages_of(tree.next_victim()).size() == 3);  // Y, the oldest leaf

  // V needs 4 pages with none free: Y (3 pages) then Z (3 pages) go; X and its leaf stay.
  const TokenContent v(20, 4);
  admit(rig, 4, v, 4);
  KvStats s = rig.kv->stats();
  CHECK(s.evicted_blocks == 6);
  CHECK(s.free_blocks == 2);
  CHECK(s.cached_blocks == 4);
  CHECK(rig.kv->lookup_prefix(TokenContent(11, 4)) == 0);
  CHECK(rig.kv->lookup_prefix(TokenContent(12, 4)) == 0);
  CHECK(rig.kv->lookup_prefix(TokenContent(10, 5)) == 4);
  // Eviction frees a parent once its last child went: X's leaf [3, 4) first, then X.
  CHECK(pool(rig).evict(2) == 4);
  CHECK(rig.kv->stats().cached_blocks == 0);
  CHECK(rig.kv->stats().evicted_blocks == 10);
  rig.check();
}

TEST_CASE("LFU evicts the least hit leaf first, LRU the oldest") {
  for (const char* policy : {"lru", "lfu"}) {
    INFO(policy);
    KvRig rig(yaml(1, std::string(", eviction: ") + policy), toy_init(9, 1));
    const TokenContent a(1, 3), b(2, 3);
    admit(rig, 0, a, 3);
    finish(rig, 0, a);
    REQUIRE(rig.kv->grow(1, a, 3, 0).ok());  // the same prompt, admitted without its prefix
    finish(rig, 1, a);  // its insert passes A (all duplicates): one hit, a newer access
    admit(rig, 2, b, 3);
    finish(rig, 2, b);                     // B: newest, no hits
    admit(rig, 3, TokenContent(3, 6), 6);  // 3 free pages + 3 evicted
    const bool lfu = std::string(policy) == "lfu";
    CHECK(rig.kv->lookup_prefix(TokenContent(1, 4)) == (lfu ? 3u : 0u));
    CHECK(rig.kv->lookup_prefix(TokenContent(2, 4)) == (lfu ? 0u : 3u));
  }
}

TEST_CASE("locked nodes are never evicted; a taken prefix does not count as evictable") {
  KvRig rig(yaml(1), toy_init(10, 1));
  const TokenContent a(1, 8);
  admit(rig, 0, a, 8);
  finish(rig, 0, a);
  const TokenContent d(1, 11);
  CHECK(rig.kv->lookup_prefix(d) == 8);
  CHECK(rig.kv->free_token_capacity() == 10);
  // 11 tokens from an 8-token prefix need 3 pages: 2 free + 8 evictable, but those 8 are the
  // prefix itself and lock first.
  const KvStats before = rig.kv->stats();
  const Status oom = rig.kv->grow(1, d, 11, 8);
  REQUIRE_FALSE(oom.ok());
  CHECK(oom.error().code == ErrorCode::kOutOfMemory);
  CHECK(oom.error().bytes_short == kTokenBytes);
  CHECK(same_stats(before, rig.kv->stats()));
  CHECK(pool(rig).tree().node_count() == 2);
  rig.check();
  REQUIRE(rig.kv->grow(1, d, 10, 8).ok());
  rig.check();
  CHECK(rig.kv->stats().evicted_blocks == 0);
  CHECK(rig.kv->stats().used_blocks == 10);
  CHECK(rig.kv->free_token_capacity() == 0);
  CHECK(code(rig.kv->grow(2, TokenContent(2, 1), 1, 0)) == ErrorCode::kOutOfMemory);
  CHECK(rig.kv->lookup_prefix(d) == 8);  // still cached
  rig.check();
}

TEST_CASE("out of memory changes nothing: no eviction, no split, no lock") {
  KvRig rig(yaml(4), toy_init(12, 4));
  const TokenContent a(1, 24), b = two_streams(1, 8, 2, 40);
  admit(rig, 0, a, 24);
  finish(rig, 0, a);                       // 6 pages cached
  admit(rig, 1, TokenContent(3, 16), 16);  // 4 private pages; 2 free
  const KvStats before = rig.kv->stats();
  const uint64_t nodes = pool(rig).tree().node_count();
  // A new sequence from an 8-token prefix wanting 40 more tokens: 10 pages > 2 + 6 - 2.
  CHECK(rig.kv->lookup_prefix(b) == 8);
  const Status s = rig.kv->grow(2, b, 48, 8);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().code == ErrorCode::kOutOfMemory);
  CHECK(s.error().bytes_short == 4 * 4 * kTokenBytes);
  CHECK(same_stats(before, rig.kv->stats()));
  CHECK(pool(rig).tree().node_count() == nodes);
  CHECK(rig.kv->seq_tokens(2) == 0);
  // An existing sequence growing past free + evictable.
  const TokenContent long_c(3, 100);
  CHECK(code(rig.kv->grow(1, long_c, 64, 0)) == ErrorCode::kOutOfMemory);
  CHECK(same_stats(before, rig.kv->stats()));
  CHECK(rig.kv->seq_tokens(1) == 16);
  rig.check();
  // Exactly free + evictable fits, evicting all of A.
  REQUIRE(rig.kv->grow(1, long_c, 48, 0).ok());
  CHECK(rig.kv->stats().evicted_blocks == 6);
  CHECK(rig.kv->stats().free_blocks == 0);
  rig.check();
}

TEST_CASE("fork shares full pages through the tree and copies the partial tail page") {
  KvRig rig(yaml(16), toy_init(20, 16));
  const TokenContent p(7, 40);
  admit(rig, 0, p, 40);
  REQUIRE(rig.kv->fork(0, 1).ok());
  rig.check();
  KvStats s = rig.kv->stats();
  CHECK(s.cow_copies == 1);
  CHECK(s.cow_bytes == 16 * kTokenBytes);
  CHECK(rig.backend.calls_of(Primitive::kCopy) == 1);
  CHECK(s.used_blocks == 2 + 1 + 1);  // [0, 32) shared, a tail page each
  CHECK(s.free_blocks == 16);
  CHECK(s.tokens_stored == 32 + 8 + 8);
  CHECK(rig.kv->seq_tokens(1) == 40);
  CHECK(rig.kv->seq_bytes(1) == 3 * 16 * kTokenBytes);
  const auto tp = pool(rig).page_table(0), tc = pool(rig).page_table(1);
  REQUIRE(tp.size() == 3);
  REQUIRE(tc.size() == 3);
  CHECK(tp[0] == tc[0]);
  CHECK(tp[1] == tc[1]);
  CHECK(tp[2] != tc[2]);
  const RadixTree& tree = pool(rig).tree();
  CHECK(tree.node_count() == 2);
  CHECK(pool(rig).seq_cached_tokens(0) == 32);
  CHECK(pool(rig).seq_cached_tokens(1) == 32);

  // They grow apart: the child samples other tokens from position 40 on.
  const TokenContent pp(7, 50), cc = two_streams(7, 40, 8, 20);
  REQUIRE(rig.kv->grow(0, pp, 50, 0).ok());
  REQUIRE(rig.kv->grow(1, cc, 60, 0).ok());
  rig.check();
  CHECK(rig.kv->stats().used_blocks == 2 + 2 + 2);
  finish(rig, 0, pp);  // inserts [32, 48) of the parent
  finish(rig, 1, cc);  // inserts its own, different [32, 48)
  s = rig.kv->stats();
  CHECK(tree.node_count() == 4);
  CHECK(s.cached_blocks == 4);
  CHECK(s.free_blocks == 16);
  CHECK(s.used_blocks == 0);
  CHECK(rig.kv->lookup_prefix(TokenContent(7, 60)) == 48);
  CHECK(rig.kv->lookup_prefix(two_streams(7, 40, 8, 30)) == 48);

  SECTION("page size 1 shares everything, copies nothing") {
    KvRig one(yaml(1), toy_init(100, 1));
    admit(one, 0, p, 40);
    REQUIRE(one.kv->fork(0, 1).ok());
    one.check();
    CHECK(one.kv->stats().cow_copies == 0);
    CHECK(one.kv->stats().used_blocks == 40);
    CHECK(code(one.kv->fork(0, 1)) == ErrorCode::kInvalidArgument);
    CHECK(code(one.kv->fork(5, 6)) == ErrorCode::kInvalidArgument);
  }
  SECTION("no free page for the tail copy: out of memory") {
    KvRig tight(yaml(16), toy_init(3, 16));
    admit(tight, 0, p, 40);
    const KvStats before = tight.kv->stats();
    CHECK(code(tight.kv->fork(0, 1)) == ErrorCode::kOutOfMemory);
    CHECK(same_stats(before, tight.kv->stats()));
    CHECK(tight.kv->seq_tokens(1) == 0);
    tight.check();
  }
}

TEST_CASE("disable_radix_cache: nothing cached, everything freed, fork copies all pages") {
  KvRig rig(yaml(4, ", disable_radix_cache: true"), toy_init(20, 4));
  const TokenContent a(1, 30);
  admit(rig, 0, a, 30);
  CHECK(rig.kv->stats().used_blocks == 8);
  REQUIRE(rig.kv->fork(0, 1).ok());
  rig.check();
  CHECK(rig.kv->stats().cow_copies == 8);
  CHECK(rig.kv->stats().used_blocks == 16);
  finish(rig, 0, a);
  finish(rig, 1, a);
  const KvStats s = rig.kv->stats();
  CHECK(s.free_blocks == 20);
  CHECK(s.cached_blocks == 0);
  CHECK(rig.kv->lookup_prefix(a) == 0);
  CHECK(code(rig.kv->grow(2, a, 30, 4)) == ErrorCode::kInvalidArgument);
  CHECK(pool(rig).tree().node_count() == 1);
}

TEST_CASE("config: page_size, eviction, disable_radix_cache are checked at load") {
  CHECK_THROWS_AS(make_kv("{impl: radix_token_pool, page_size: 0}"), ConfigError);
  CHECK_THROWS_AS(make_kv("{impl: radix_token_pool, eviction: lru2}"), ConfigError);
  CHECK_THROWS_AS(make_kv("{impl: radix_token_pool, disable_radix_cache: maybe}"), ConfigError);
  const auto config_of = [](const std::string& yaml) {
    const std::unique_ptr<KvCacheManager> kv = make_kv(yaml);
    const auto* pool = dynamic_cast<const RadixTokenPool*>(kv.get());
    REQUIRE(pool != nullptr);
    return pool->config();
  };
  const RadixTokenPoolConfig c = config_of(
      "{impl: radix_token_pool, page_size: 64, eviction: lfu, disable_radix_cache: true}");
  CHECK(c.page_size == 64);
  CHECK(c.eviction == RadixTree::Policy::kLfu);
  CHECK(c.disable_radix_cache);
  CHECK(config_of("{impl: radix_token_pool}").page_size == 1);
}

// Random admissions (from cached prefixes), decode steps, forks and finishes over a few shared
// prompts; invariants after every step; then everything is released, evicted and torn down.
void random_run(uint32_t page_size, const std::string& eviction, uint32_t seed) {
  const uint32_t pages = 600 / page_size;
  KvRig rig(yaml(page_size, ", eviction: " + eviction), toy_init(pages, page_size));
  std::mt19937 rng(seed);
  auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  std::map<SeqId, TokenContent> live;
  SeqId next = 0;
  uint64_t ooms = 0, hits = 0;
  for (int step = 0; step < 3000; ++step) {
    const uint32_t op = pick(10);
    if (op < 3 || live.empty()) {  // admit: one of 4 system prompts + a user part
      TokenContent c(100 + pick(4), 20 + pick(40));
      c.append(200 + pick(6), 1 + pick(30));
      const uint32_t prefix = rig.kv->lookup_prefix(c);
      hits += prefix;
      const Status s = rig.kv->grow(next, c, c.size(), prefix);
      if (s.ok())
        live.emplace(next++, c);
      else
        ++ooms;
    } else if (op < 7) {  // decode a few tokens
      auto it = std::next(live.begin(), pick(static_cast<uint32_t>(live.size())));
      TokenContent c = it->second;
      c.append(1000 + it->first, 1 + pick(8));
      if (rig.kv->grow(it->first, c, c.size(), 0).ok()) it->second = c;
    } else if (op < 8) {  // fork
      auto it = std::next(live.begin(), pick(static_cast<uint32_t>(live.size())));
      if (rig.kv->fork(it->first, next).ok()) live.emplace(next++, it->second);
    } else {  // finish
      auto it = std::next(live.begin(), pick(static_cast<uint32_t>(live.size())));
      rig.kv->release(it->first, it->second);
      live.erase(it);
    }
    std::string why;
    if (!rig.kv->check_invariants(&why)) FAIL("step " << step << ": " << why);
    const KvStats s = rig.kv->stats();
    REQUIRE(s.used_blocks + s.cached_blocks + s.free_blocks == s.total_blocks);
  }
  CHECK(hits > 0);
  CHECK(ooms > 0);
  for (const auto& [id, c] : live) rig.kv->release(id, c);
  rig.check();
  const KvStats s = rig.kv->stats();
  CHECK(s.used_blocks == 0);
  CHECK(s.free_blocks + s.cached_blocks == pages);
  CHECK(rig.kv->free_token_capacity() == uint64_t{pages} * page_size);
  pool(rig).evict(pages);
  rig.check();
  CHECK(rig.kv->stats().free_blocks == pages);
  CHECK(pool(rig).tree().node_count() == 1);
  REQUIRE(rig.kv->shutdown().ok());
  CHECK(rig.backend.usage().physical_bytes == 0);
}

TEST_CASE("random workload: invariants every step, all free after release + evict, teardown") {
  random_run(1, "lru", 1);
  random_run(4, "lru", 2);
  random_run(16, "lfu", 3);
  random_run(1, "lfu", 4);
}

TEST_CASE("seq_capacity: the tree prefix plus private pages, capped at max_model_len") {
  KvRig rig(yaml(4), toy_init(16, 4));
  const TokenContent c(1, 100);
  CHECK(rig.kv->seq_capacity(1) == 0);
  admit(rig, 1, c, 6);  // 2 private pages
  CHECK(rig.kv->seq_capacity(1) == 8);
  finish(rig, 1, c);    // the tree keeps page [0, 4)
  admit(rig, 2, c, 9);  // 4 tokens through the tree + 2 private pages
  CHECK(pool(rig).seq_cached_tokens(2) == 4);
  CHECK(rig.kv->seq_capacity(2) == 12);
  KvStats want = rig.kv->stats();
  REQUIRE(rig.kv->grow(2, c, 12, 0).ok());  // within capacity: only the token counters move
  want.tokens_stored += 3;
  CHECK(same_stats(rig.kv->stats(), want));
  CHECK(rig.kv->stats().free_blocks == want.free_blocks);

  KvInit short_init = toy_init(16, 4);
  short_init.max_model_len = 6;
  KvRig capped(yaml(4), short_init);
  admit(capped, 1, c, 5);
  CHECK(capped.kv->seq_capacity(1) == 6);
}

}  // namespace
}  // namespace memsim::test
