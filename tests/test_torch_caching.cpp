// Tests of TorchCachingAllocator: exact PyTorch rounding/segment/split/best-fit numbers + fuzzing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "src/alloc/torch_caching.h"

namespace memsim {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kBase = 0x100000000ull;
constexpr StreamId kS0{0};
constexpr StreamId kS1{1};

using TCA = TorchCachingAllocator;

// Bump-pointer segment source: 2 MiB-aligned addresses from kBase, optional capacity limit.
struct FakeSource : SegmentSource {
  explicit FakeSource(uint64_t cap = UINT64_MAX) : capacity(cap) {}

  Result<DevPtr> allocate_segment(uint64_t bytes, StreamId /*stream*/) override {
    ++alloc_calls;
    if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "fake: 0 bytes");
    if (bytes > capacity || outstanding_bytes > capacity - bytes) {
      ++failed_allocs;
      return make_error(ErrorCode::kOutOfMemory, "fake: full",
                        outstanding_bytes + bytes - capacity);
    }
    const DevPtr p = next;
    next += (bytes + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
    outstanding[p] = bytes;
    outstanding_bytes += bytes;
    return p;
  }

  Status release_segment(DevPtr p, uint64_t bytes) override {
    ++release_calls;
    auto it = outstanding.find(p);
    if (it == outstanding.end() || it->second != bytes) {
      return make_error(ErrorCode::kInvalidArgument, "fake: bad release");
    }
    outstanding.erase(it);
    outstanding_bytes -= bytes;
    return {};
  }

  uint64_t capacity;
  DevPtr next = kBase;
  std::map<DevPtr, uint64_t> outstanding;
  uint64_t outstanding_bytes = 0;
  int alloc_calls = 0;
  int failed_allocs = 0;
  int release_calls = 0;
};

DevPtr must_malloc(TCA& a, uint64_t bytes, StreamId s = kS0) {
  auto r = a.malloc(bytes, s);
  REQUIRE(r.ok());
  return *r;
}

void must_free(TCA& a, DevPtr p) {
  REQUIRE(a.free(p).ok());
}

void require_invariants(const TCA& a) {
  std::string why;
  INFO(why);
  REQUIRE(a.check_invariants(&why));
}

uint64_t live_size(const TCA& a, DevPtr p) {
  for (const LiveBlock& b : a.live_blocks()) {
    if (b.ptr == p) return b.size;
  }
  return 0;
}

TEST_CASE("round_size and segment_size_for follow PyTorch", "[torch_caching]") {
  CHECK(TCA::round_size(1) == 512);
  CHECK(TCA::round_size(511) == 512);
  CHECK(TCA::round_size(512) == 512);
  CHECK(TCA::round_size(513) == 1024);
  CHECK(TCA::round_size(1000) == 1024);
  CHECK(TCA::round_size(kMiB) == kMiB);
  CHECK(TCA::round_size(kMiB + 1) == kMiB + 512);

  CHECK(TCA::segment_size_for(TCA::round_size(1)) == 2 * kMiB);
  CHECK(TCA::segment_size_for(kMiB) == 2 * kMiB);
  CHECK(TCA::segment_size_for(kMiB + 512) == 20 * kMiB);
  CHECK(TCA::segment_size_for(10 * kMiB - 512) == 20 * kMiB);
  CHECK(TCA::segment_size_for(10 * kMiB) == 10 * kMiB);
  CHECK(TCA::segment_size_for(TCA::round_size(10 * kMiB + 1)) == 12 * kMiB);
  CHECK(TCA::segment_size_for(TCA::round_size(19 * kMiB + kMiB / 2)) == 20 * kMiB);

  // roundup_power2_divisions (off by default).
  CHECK(TCA::roundup_power2_next_division(1200, 4) == 1280);  // PyTorch's own example
  CHECK(TCA::round_size(1200, 4) == 1536);  // not above 512 * 4: plain 512 rounding
  CHECK(TCA::round_size(2049, 4) == 2560);
  CHECK(TCA::round_size(4096, 4) == 4096);
  CHECK(TCA::round_size(5000, 4) == 5120);
  CHECK(TCA::round_size(9 * kMiB + 1, 4) == 10 * kMiB);
  CHECK(TCA::round_size(9 * kMiB + 1, 8) == 9 * kMiB + kMiB);
  CHECK(TCA::round_size(9 * kMiB + 1, 16) == 9 * kMiB + kMiB / 2);
}

TEST_CASE("small allocations pack into one 2 MiB segment", "[torch_caching]") {
  FakeSource src;
  TCA a(src);
  const DevPtr p1 = must_malloc(a, 1000);
  const DevPtr p2 = must_malloc(a, 1000);
  const DevPtr p3 = must_malloc(a, 1000);
  CHECK(p1 == kBase);
  CHECK(p2 == p1 + 1024);
  CHECK(p3 == p2 + 1024);
  CHECK(a.stats().reserved_bytes == 2 * kMiB);
  CHECK(a.stats().allocated_bytes == 3072);
  CHECK(a.stats().requested_bytes == 3000);
  CHECK(a.stats().segments == 1);
  CHECK(a.stats().live_blocks == 3);
  CHECK(src.alloc_calls == 1);
  CHECK(a.free_block_count() == 1);
  require_invariants(a);

  // Small pool splits whenever the remainder is >= 512 B.
  FakeSource src2;
  TCA b(src2);
  const DevPtr q1 = must_malloc(b, kMiB);
  const DevPtr q2 = must_malloc(b, kMiB - 512);  // leaves exactly 512 B: split
  const DevPtr q3 = must_malloc(b, 100);
  CHECK(q2 == q1 + kMiB);
  CHECK(q3 == q1 + 2 * kMiB - 512);
  CHECK(b.stats().segments == 1);
  CHECK(b.free_block_count() == 0);
  require_invariants(b);
}

TEST_CASE("large requests split 20 MiB segments; small remainders stay attached",
          "[torch_caching]") {
  FakeSource src;
  TCA a(src);
  const DevPtr p1 = must_malloc(a, 3 * kMiB);
  CHECK(p1 == kBase);
  CHECK(a.stats().reserved_bytes == 20 * kMiB);
  CHECK(a.stats().allocated_bytes == 3 * kMiB);
  const DevPtr p2 = must_malloc(a, 5 * kMiB);
  CHECK(p2 == p1 + 3 * kMiB);
  CHECK(a.stats().segments == 1);
  CHECK(a.stats().allocated_bytes == 8 * kMiB);

  // 19.5 MiB -> fresh 20 MiB segment; remainder 0.5 MiB <= 1 MiB: no split.
  const DevPtr p3 = must_malloc(a, 19 * kMiB + kMiB / 2);
  CHECK(a.stats().segments == 2);
  CHECK(p3 == kBase + 20 * kMiB);
  CHECK(live_size(a, p3) == 20 * kMiB);
  CHECK(a.stats().allocated_bytes == 28 * kMiB);
  CHECK(a.stats().requested_bytes == 8 * kMiB + 19 * kMiB + kMiB / 2);

  // 11 MiB into the 12 MiB remainder of segment 1: remainder exactly 1 MiB, not split.
  const DevPtr p4 = must_malloc(a, 11 * kMiB);
  CHECK(p4 == p1 + 8 * kMiB);
  CHECK(live_size(a, p4) == 12 * kMiB);
  CHECK(a.stats().segments == 2);
  CHECK(a.free_block_count() == 0);
  require_invariants(a);
}

TEST_CASE("best fit takes the smallest fitting block, lowest address on ties", "[torch_caching]") {
  FakeSource src;
  TCA a(src);
  const DevPtr A = must_malloc(a, 12 * kMiB);
  const DevPtr B = must_malloc(a, 14 * kMiB);
  const DevPtr C = must_malloc(a, 12 * kMiB);
  CHECK(B == A + 12 * kMiB);
  CHECK(C == B + 14 * kMiB);
  must_free(a, C);
  must_free(a, B);
  must_free(a, A);
  CHECK(must_malloc(a, 11 * kMiB) == A);
  CHECK(must_malloc(a, 11 * kMiB) == C);
  CHECK(must_malloc(a, 13 * kMiB) == B);
  CHECK(a.stats().segment_allocs == 3);

  const DevPtr s_a = must_malloc(a, 4096);
  must_malloc(a, 512);
  const DevPtr s_c = must_malloc(a, 2048);
  must_malloc(a, 512);
  const DevPtr s_e = must_malloc(a, 1024);
  must_malloc(a, 512);
  must_free(a, s_a);
  must_free(a, s_c);
  must_free(a, s_e);
  CHECK(must_malloc(a, 1000) == s_e);        // exact 1024 fit
  CHECK(must_malloc(a, 1500) == s_c);        // 2048 block, split
  CHECK(must_malloc(a, 3000) == s_a);        // 4096 block, split
  CHECK(must_malloc(a, 400) == s_c + 1536);  // the 512 B left of the 2048 block
  require_invariants(a);
}

TEST_CASE("freeing coalesces neighbours; empty_cache returns whole segments", "[torch_caching]") {
  FakeSource src;
  TCA a(src);
  const DevPtr p1 = must_malloc(a, 1000);
  const DevPtr p2 = must_malloc(a, 1000);
  const DevPtr p3 = must_malloc(a, 1000);
  const DevPtr l1 = must_malloc(a, 3 * kMiB);
  const DevPtr l2 = must_malloc(a, 5 * kMiB);
  CHECK(a.free_block_count() == 2);
  must_free(a, p2);
  CHECK(a.free_block_count() == 3);
  must_free(a, p1);  // merges with p2
  CHECK(a.free_block_count() == 3);
  must_free(a, p3);  // merges with p1..p2 and the tail
  CHECK(a.free_block_count() == 2);
  require_invariants(a);

  // Empty cache keeps segments that still hold a live block.
  CHECK(a.empty_cache().ok());
  CHECK(a.stats().reserved_bytes == 20 * kMiB);
  CHECK(a.stats().segment_releases == 1);
  must_free(a, l1);
  must_free(a, l2);
  CHECK(a.free_block_count() == 1);
  CHECK(a.stats().allocated_bytes == 0);
  CHECK(a.live_blocks().empty());
  CHECK(must_malloc(a, 2 * kMiB) == l1);  // whole segment again, split from its start
  must_free(a, l1);
  require_invariants(a);
  CHECK(a.empty_cache().ok());
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(a.stats().segments == 0);
  CHECK(a.stats().segment_releases == 2);
  CHECK(src.outstanding.empty());
  CHECK(a.stats().peak_reserved_bytes == 22 * kMiB);
  CHECK(a.stats().peak_allocated_bytes == 3072 + 8 * kMiB);
  require_invariants(a);
}

TEST_CASE("blocks are reused only on their own stream", "[torch_caching]") {
  FakeSource src;
  TCA a(src);
  const DevPtr p = must_malloc(a, 1000, kS0);
  must_free(a, p);
  const DevPtr q = must_malloc(a, 1000, kS1);
  CHECK(q != p);
  CHECK(a.stats().segment_allocs == 2);
  CHECK(must_malloc(a, 1000, kS0) == p);
  const DevPtr l = must_malloc(a, 3 * kMiB, kS0);
  must_free(a, l);
  const DevPtr m = must_malloc(a, 3 * kMiB, kS1);
  CHECK(m != l);
  CHECK(a.stats().segment_allocs == 4);
  CHECK(must_malloc(a, 3 * kMiB, kS0) == l);
  require_invariants(a);
}

TEST_CASE("max_split_size limits splitting and oversize reuse", "[torch_caching]") {
  const TorchCachingConfig cfg{16 * kMiB, 0};
  SECTION("requests below max_split_size never take an oversize block") {
    FakeSource src;
    TCA a(src, cfg);
    const DevPtr p = must_malloc(a, 3 * kMiB);  // 20 MiB segment, split: 3 + 17 (free)
    const DevPtr q = must_malloc(a, 5 * kMiB);  // 17 MiB >= 16 MiB refused: new segment
    CHECK(q == p + 20 * kMiB);
    CHECK(a.stats().segment_allocs == 2);
    const DevPtr r = must_malloc(a, 6 * kMiB);  // best fit: the 15 MiB remainder
    CHECK(r == q + 5 * kMiB);
    const DevPtr s = must_malloc(a, 16 * kMiB);  // >= max_split: takes 17 MiB, no split
    CHECK(s == p + 3 * kMiB);
    CHECK(live_size(a, s) == 17 * kMiB);
    require_invariants(a);
  }
  SECTION("oversize blocks serve requests within 20 MiB of their size") {
    FakeSource src;
    TCA a(src, cfg);
    const DevPtr big = must_malloc(a, 30 * kMiB);
    must_free(a, big);
    const DevPtr m = must_malloc(a, 12 * kMiB);  // below max_split: not the 30 MiB block
    CHECK(m != big);
    CHECK(a.stats().segment_allocs == 2);
    const DevPtr x = must_malloc(a, 25 * kMiB);  // 30 < 25 + 20: reuse whole
    CHECK(x == big);
    CHECK(live_size(a, x) == 30 * kMiB);
    const DevPtr huge = must_malloc(a, 40 * kMiB);
    must_free(a, huge);
    const DevPtr y = must_malloc(a, 18 * kMiB);  // 40 >= 18 + 20: refused
    CHECK(y != huge);
    CHECK(live_size(a, y) == 18 * kMiB);
    const DevPtr z = must_malloc(a, 21 * kMiB);  // 40 < 21 + 20: reuse whole
    CHECK(z == huge);
    CHECK(live_size(a, z) == 40 * kMiB);
    require_invariants(a);
  }
  SECTION("default config splits the same blocks") {
    FakeSource src;
    TCA a(src);
    const DevPtr huge = must_malloc(a, 40 * kMiB);
    must_free(a, huge);
    const DevPtr y = must_malloc(a, 18 * kMiB);
    CHECK(y == huge);
    CHECK(live_size(a, y) == 18 * kMiB);
    CHECK(a.stats().segment_allocs == 1);
    require_invariants(a);
  }
  SECTION("on OOM, oversize cached blocks are released first, small cache kept") {
    const bool single = GENERATE(true, false);
    FakeSource src(single ? 80 * kMiB : 100 * kMiB);
    TCA a(src, cfg);
    const DevPtr b30 = must_malloc(a, 30 * kMiB);
    const DevPtr b40 = must_malloc(a, 40 * kMiB);
    const DevPtr sm = must_malloc(a, 1000);
    must_free(a, b30);
    must_free(a, b40);
    must_free(a, sm);
    CHECK(a.stats().reserved_bytes == 72 * kMiB);
    if (single) {
      // Needs a 20 MiB segment: frees the smallest oversize block >= max_split_size.
      must_malloc(a, 8 * kMiB);
      CHECK(a.stats().segment_releases == 1);
      CHECK(a.stats().reserved_bytes == 62 * kMiB);
      CHECK(src.outstanding.count(b30) == 0);
      CHECK(src.outstanding.count(b40) == 1);
    } else {
      // No single block covers 50 MiB: frees the largest oversize blocks until they do.
      must_malloc(a, 50 * kMiB);
      CHECK(a.stats().segment_releases == 2);
      CHECK(a.stats().reserved_bytes == 52 * kMiB);
    }
    CHECK(src.outstanding.count(sm) == 1);
    CHECK(a.stats().ooms == 0);
    require_invariants(a);
  }
}

TEST_CASE("out of memory: cached segments are released and the allocation retried",
          "[torch_caching]") {
  FakeSource src(40 * kMiB);
  TCA a(src);
  const DevPtr l = must_malloc(a, 3 * kMiB);  // 20 MiB segment
  const DevPtr s = must_malloc(a, 1000);      // 2 MiB segment
  must_free(a, s);
  CHECK(a.stats().reserved_bytes == 22 * kMiB);

  // 20 MiB does not fit next to 22 MiB; releasing the cached small segment makes room.
  const DevPtr b = must_malloc(a, 20 * kMiB);
  CHECK(a.stats().reserved_bytes == 40 * kMiB);
  CHECK(a.stats().segment_releases == 1);
  CHECK(src.failed_allocs == 1);
  CHECK(a.stats().ooms == 0);

  // 18 MiB: no cached block fits, nothing releasable (segment 1 is split).
  auto r = a.malloc(18 * kMiB, kS0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::kOutOfMemory);
  CHECK(r.error().bytes_short == 18 * kMiB);
  CHECK(a.stats().ooms == 1);
  CHECK(src.failed_allocs == 3);  // first try + the retry after release_cached_blocks
  require_invariants(a);

  // Still usable: fits in the 17 MiB remainder, and after a free the 20 MiB block serves 18.
  const DevPtr c = must_malloc(a, 10 * kMiB);
  CHECK(c == l + 3 * kMiB);
  must_free(a, b);
  CHECK(must_malloc(a, 18 * kMiB) == b);
  CHECK(a.stats().ooms == 1);
  require_invariants(a);
}

TEST_CASE("misuse returns error values", "[torch_caching]") {
  FakeSource src;
  TCA a(src);
  auto z = a.malloc(0, kS0);
  REQUIRE_FALSE(z.ok());
  CHECK(z.error().code == ErrorCode::kInvalidArgument);
  CHECK(a.free(0xdead).error().code == ErrorCode::kInvalidArgument);
  const DevPtr p = must_malloc(a, 4096);
  CHECK(a.free(p + 512).error().code == ErrorCode::kInvalidArgument);
  must_free(a, p);
  CHECK(a.free(p).error().code == ErrorCode::kInvalidArgument);
  auto huge = a.malloc(1ull << 62, kS0);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.error().code == ErrorCode::kOutOfMemory);
  CHECK(a.stats().live_blocks == 0);
  require_invariants(a);
}

TEST_CASE("release_all frees every block and segment", "[torch_caching]") {
  FakeSource src;
  TCA a(src);
  must_malloc(a, 1000);
  must_malloc(a, 3 * kMiB, kS1);
  const DevPtr p = must_malloc(a, 64 * kMiB);
  must_free(a, p);
  CHECK(a.release_all().ok());
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(a.stats().allocated_bytes == 0);
  CHECK(a.stats().live_blocks == 0);
  CHECK(a.live_blocks().empty());
  CHECK(src.outstanding.empty());
  require_invariants(a);
  must_malloc(a, 1000);  // usable again
  require_invariants(a);
}

TEST_CASE("the destructor frees bookkeeping only and never calls the source", "[torch_caching]") {
  FakeSource src;
  {
    TCA a(src);
    must_malloc(a, 1000);
    const DevPtr p = must_malloc(a, 3 * kMiB);
    must_malloc(a, 5 * kMiB);
    must_free(a, p);
  }
  CHECK(src.release_calls == 0);
  CHECK(src.outstanding.size() == 2);
}

void fuzz(TorchCachingConfig cfg, uint64_t seed, int ops) {
  FakeSource src(1280 * kMiB);  // tight enough that some requests run out of memory
  std::mt19937_64 rng(seed);
  std::map<DevPtr, uint64_t> live;  // caller's view: ptr -> requested bytes
  std::vector<DevPtr> order;
  uint64_t ooms = 0;
  {
    TCA a(src, cfg);
    for (int i = 1; i <= ops; ++i) {
      const bool do_malloc = order.empty() || (order.size() < 400 && rng() % 100 < 52);
      if (do_malloc) {
        const uint64_t bits = rng() % 27;  // log-uniform sizes, 1 B .. 64 MiB
        const uint64_t bytes = 1 + rng() % (1ull << bits);
        const StreamId stream{static_cast<uint32_t>(rng() % 2)};
        auto r = a.malloc(bytes, stream);
        if (!r.ok()) {
          REQUIRE(r.error().code == ErrorCode::kOutOfMemory);
          ++ooms;
        } else {
          const DevPtr p = *r;
          auto next = live.lower_bound(p);
          REQUIRE((next == live.end() || p + bytes <= next->first));
          if (next != live.begin()) {
            auto prev = std::prev(next);
            REQUIRE(prev->first + prev->second <= p);
          }
          live.emplace(p, bytes);
          order.push_back(p);
        }
      } else {
        const size_t k = rng() % order.size();
        const DevPtr p = order[k];
        order[k] = order.back();
        order.pop_back();
        live.erase(p);
        REQUIRE(a.free(p).ok());
      }
      if (i % 5000 == 0) REQUIRE(a.empty_cache().ok());
      if (i % 1000 == 0) {
        require_invariants(a);
        REQUIRE(a.stats().live_blocks == live.size());
        REQUIRE(src.outstanding_bytes == a.stats().reserved_bytes);
      }
    }
    require_invariants(a);
    CHECK(a.stats().ooms == ooms);
    CHECK(ooms > 0);  // the release-and-retry and OOM paths were exercised
    REQUIRE(a.release_all().ok());
    CHECK(a.stats().reserved_bytes == 0);
    CHECK(src.outstanding.empty());
    require_invariants(a);
  }
  CHECK(src.outstanding.empty());
}

TEST_CASE("randomized malloc/free keeps the invariants (default config)", "[torch_caching]") {
  fuzz(TorchCachingConfig{}, 0x5eed, 200000);
}

TEST_CASE("randomized malloc/free keeps the invariants (max_split 16 MiB, power2 rounding)",
          "[torch_caching]") {
  TorchCachingConfig cfg{16 * kMiB};
  cfg.set_roundup_power2_divisions(4);
  fuzz(cfg, 0xbeef, 100000);
}

}  // namespace
}  // namespace memsim
