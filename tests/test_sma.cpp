// Tests of Sma and its MemoryHeap: best fit, coalescing, split rules, stream-aware reuse, GC,
// VMM growth and trimming, the device_malloc region, out of memory, misuse, and fuzzing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "src/alloc/registry.h"
#include "src/alloc/sma.h"
#include "src/config/config_node.h"

namespace memsim {
namespace {

constexpr uint64_t kK = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kG = 2 * kMiB;  // granularity
constexpr StreamId kS0{0};
constexpr StreamId kS1{1};
constexpr StreamId kS2{2};
constexpr StreamId kS3{3};
using Region = SmaConfig::Region;
using P = Primitive;

GpuSpec test_gpu(uint64_t capacity) {
  GpuSpec g;
  g.name = "test";
  g.capacity = capacity;
  g.granularity = kG;
  g.va_space = 1ull << 40;
  return g;  // every cost term 0: these tests count bytes and calls, not time
}

struct Sim {
  explicit Sim(uint64_t capacity = 256 * kMiB) : b(test_gpu(capacity), clock) {}
  SimClock clock;
  SimBackend b;
};

SmaConfig heap_of(uint64_t bytes, Region region = Region::kVmm) {
  SmaConfig c;
  c.heap_size = bytes;
  c.region = region;
  return c;
}

void require_invariants(const Sma& a) {
  std::string why;
  const bool ok = a.check_invariants(&why);
  INFO(why);
  REQUIRE(ok);
}

void require_invariants(const MemoryHeap& h) {
  std::string why;
  const bool ok = h.check_invariants(&why);
  INFO(why);
  REQUIRE(ok);
}

void require_invariants(const SimBackend& b) {
  std::string why;
  const bool ok = b.check_invariants(&why);
  INFO(why);
  REQUIRE(ok);
}

DevPtr must_malloc(Sma& a, uint64_t bytes, StreamId s = kS0) {
  auto r = a.malloc(bytes, s);
  INFO((r.ok() ? std::string() : r.error().message));
  REQUIRE(r.ok());
  return *r;
}

void must_free(Sma& a, DevPtr p) {
  REQUIRE(a.free(p).ok());
}

uint64_t live_size(const Sma& a, DevPtr p) {
  for (const LiveBlock& b : a.live_blocks())
    if (b.ptr == p) return b.size;
  return 0;
}

bool same_stats(const AllocatorStats& x, const AllocatorStats& y) {
  return x.reserved_bytes == y.reserved_bytes && x.peak_reserved_bytes == y.peak_reserved_bytes &&
         x.allocated_bytes == y.allocated_bytes &&
         x.peak_allocated_bytes == y.peak_allocated_bytes &&
         x.requested_bytes == y.requested_bytes && x.segments == y.segments &&
         x.live_blocks == y.live_blocks && x.segment_allocs == y.segment_allocs &&
         x.segment_releases == y.segment_releases && x.ooms == y.ooms;
}

// Idle ranges as offset -> size, for exact comparisons.
using Ranges = std::map<uint64_t, uint64_t>;

}  // namespace

TEST_CASE("heap: best fit takes the smallest range that fits, lowest offset first", "[sma][heap]") {
  MemoryHeap h(100 * kK);
  CHECK(h.aligned_allocate(512, 10 * kK) == 0u);
  const auto b = h.aligned_allocate(512, 30 * kK);
  CHECK(b == 10 * kK);
  CHECK(h.aligned_allocate(512, 10 * kK) == 40 * kK);
  const auto d = h.aligned_allocate(512, 20 * kK);
  CHECK(d == 50 * kK);
  CHECK(h.aligned_allocate(512, 10 * kK) == 70 * kK);
  REQUIRE(h.release(*b).ok());
  REQUIRE(h.release(*d).ok());
  CHECK(h.idle_ranges() == Ranges{{10 * kK, 30 * kK}, {50 * kK, 20 * kK}, {80 * kK, 20 * kK}});
  require_invariants(h);

  CHECK(h.aligned_allocate(512, 15 * kK) == 50 * kK);  // 20K ranges beat 30K; lower offset wins
  CHECK(h.aligned_allocate(512, 20 * kK) == 80 * kK);  // an exact fit
  CHECK(h.aligned_allocate(512, 25 * kK) == 10 * kK);  // only the 30K range is left that fits
  CHECK(h.idle_ranges() == Ranges{{35 * kK, 5 * kK}, {65 * kK, 5 * kK}});
  CHECK_FALSE(h.aligned_allocate(512, 6 * kK).has_value());  // 10K idle, but no 6K range
  CHECK(h.aligned_allocate(512, 5 * kK) == 35 * kK);
  CHECK(h.used_bytes() == 95 * kK);
  CHECK(h.largest_idle() == 5 * kK);
  CHECK(h.used_end() == 100 * kK);
  require_invariants(h);
}

TEST_CASE("heap: release coalesces with free neighbours in both trees", "[sma][heap]") {
  MemoryHeap h(100 * kK);
  const uint64_t a = *h.aligned_allocate(512, 10 * kK);
  const uint64_t b = *h.aligned_allocate(512, 10 * kK);
  const uint64_t c = *h.aligned_allocate(512, 10 * kK);
  REQUIRE(h.release(a).ok());
  CHECK(h.idle_ranges() == Ranges{{0, 10 * kK}, {30 * kK, 70 * kK}});
  REQUIRE(h.release(c).ok());  // merges with the tail
  CHECK(h.idle_ranges() == Ranges{{0, 10 * kK}, {20 * kK, 80 * kK}});
  CHECK(h.used_end() == 20 * kK);
  REQUIRE(h.release(b).ok());  // merges with both
  CHECK(h.idle_ranges() == Ranges{{0, 100 * kK}});
  CHECK(h.used_ranges().empty());
  CHECK(h.used_end() == 0);
  CHECK(h.largest_idle() == 100 * kK);
  require_invariants(h);

  // Misuse changes nothing.
  CHECK(h.release(b).error().code == ErrorCode::kInvalidArgument);
  CHECK(h.release(5 * kK, kK).error().code == ErrorCode::kInvalidArgument);
  CHECK_FALSE(h.aligned_allocate(512, 0).has_value());
  CHECK_FALSE(h.aligned_allocate(768, kK).has_value());  // not a power of two
  CHECK_FALSE(h.aligned_allocate(512, 101 * kK).has_value());

  // A sub-range of a used range: the parts on either side stay used, as ranges of their own.
  CHECK(h.aligned_allocate(512, 30 * kK) == 0u);
  REQUIRE(h.release(10 * kK, 10 * kK).ok());
  CHECK(h.used_ranges() == Ranges{{0, 10 * kK}, {20 * kK, 10 * kK}});
  CHECK(h.idle_ranges() == Ranges{{10 * kK, 10 * kK}, {30 * kK, 70 * kK}});
  CHECK(h.release(5 * kK, 10 * kK).error().code == ErrorCode::kInvalidArgument);  // crosses a gap
  REQUIRE(h.release(20 * kK).ok());
  CHECK(h.idle_ranges() == Ranges{{10 * kK, 90 * kK}});
  CHECK(h.used_end() == 10 * kK);
  require_invariants(h);
}

TEST_CASE("heap: alignment padding stays idle in front of the range", "[sma][heap]") {
  MemoryHeap h(100 * kK);
  CHECK(h.aligned_allocate(512, kK) == 0u);
  CHECK(h.aligned_allocate(4 * kK, 4 * kK) == 4 * kK);
  CHECK(h.idle_ranges() == Ranges{{kK, 3 * kK}, {8 * kK, 92 * kK}});
  CHECK(h.aligned_allocate(512, 3 * kK) == kK);  // the padding is the best fit now
  require_invariants(h);
}

TEST_CASE("sma: rounding, chunk sizes and split rules", "[sma]") {
  CHECK(Sma::round_size(1) == 512);
  CHECK(Sma::round_size(512) == 512);
  CHECK(Sma::round_size(513) == 1024);
  CHECK(Sma::chunk_size_for(512) == 2 * kMiB);
  CHECK(Sma::chunk_size_for(kMiB) == 2 * kMiB);
  CHECK(Sma::chunk_size_for(kMiB + 512) == 20 * kMiB);
  CHECK(Sma::chunk_size_for(10 * kMiB - 512) == 20 * kMiB);
  CHECK(Sma::chunk_size_for(10 * kMiB) == 10 * kMiB);
  CHECK(Sma::chunk_size_for(11 * kMiB + 512) == 12 * kMiB);

  Sim sim;
  Sma a(sim.b);
  const DevPtr a1 = must_malloc(a, 1000);  // small chunk [0, 2 MiB), split
  const DevPtr base = a.base();
  CHECK(a1 == base);
  CHECK(live_size(a, a1) == 1024);
  CHECK(a.cached_bytes() == 2 * kMiB - 1024);
  CHECK(must_malloc(a, 1000) == base + 1024);  // the remainder, split again
  CHECK(must_malloc(a, kMiB) == base + 2048);
  // Small pool: a remainder of exactly 512 B is split off and serves a later 512 B request.
  const DevPtr a4 = must_malloc(a, kMiB - 2560);
  CHECK(a4 == base + 2048 + kMiB);
  CHECK(live_size(a, a4) == kMiB - 2560);
  CHECK(must_malloc(a, 1) == base + 2 * kMiB - 512);
  CHECK(a.cached_blocks() == 0);

  // Large pool: 11 MiB takes a 12 MiB chunk; the 1 MiB remainder is not > 1 MiB: not split.
  const DevPtr e = must_malloc(a, 11 * kMiB);
  CHECK(e == base + 2 * kMiB);
  CHECK(live_size(a, e) == 12 * kMiB);
  CHECK(a.cached_blocks() == 0);
  // 3 MiB takes a 20 MiB chunk and splits it (remainder 17 MiB > 1 MiB).
  const DevPtr c = must_malloc(a, 3 * kMiB);
  CHECK(c == base + 14 * kMiB);
  CHECK(live_size(a, c) == 3 * kMiB);
  CHECK(a.cached_bytes() == 17 * kMiB);
  CHECK(a.stats().reserved_bytes == 34 * kMiB);
  CHECK(a.stats().segments == 17);
  // 16 MiB fits the cached 17 MiB block; its 1 MiB remainder is not split off either.
  const DevPtr f = must_malloc(a, 16 * kMiB);
  CHECK(f == base + 17 * kMiB);
  CHECK(live_size(a, f) == 17 * kMiB);
  CHECK(a.cached_blocks() == 0);
  // A small request never takes a large-pool block.
  must_free(a, f);
  const DevPtr s = must_malloc(a, 4 * kK);
  CHECK(s == base + 34 * kMiB);  // a new small chunk above everything
  const AllocatorStats st = a.stats();
  CHECK(st.allocated_bytes == 2 * kMiB + 12 * kMiB + 3 * kMiB + 4 * kK);
  CHECK(st.requested_bytes == 2000 + kMiB + kMiB - 2560 + 1 + 11 * kMiB + 3 * kMiB + 4 * kK);
  CHECK(st.live_blocks == 8);
  CHECK(st.reserved_bytes == 36 * kMiB);
  require_invariants(a);
  REQUIRE(a.release_all().ok());
}

TEST_CASE("sma: max_split_size keeps big blocks whole and limits their reuse", "[sma]") {
  Sim sim;
  SmaConfig cfg;
  cfg.max_split_size = 32 * kMiB;
  Sma a(sim.b, cfg);
  const DevPtr p = must_malloc(a, 40 * kMiB);
  const DevPtr base = a.base();
  CHECK(p == base);
  must_free(a, p);
  // A request below max_split_size takes no block at or above it.
  const DevPtr q = must_malloc(a, 4 * kMiB);
  CHECK(q == base + 40 * kMiB);
  // An oversize request reuses an oversize block within kLargeBuffer of its size, unsplit.
  const DevPtr r = must_malloc(a, 38 * kMiB);
  CHECK(r == p);
  CHECK(live_size(a, r) == 40 * kMiB);
  const DevPtr t = must_malloc(a, 64 * kMiB);
  CHECK(t == base + 60 * kMiB);
  must_free(a, t);
  // The cached 64 MiB block is 24 MiB too big for 40 MiB (>= kLargeBuffer): a new chunk.
  const DevPtr v = must_malloc(a, 40 * kMiB);
  CHECK(v == base + 124 * kMiB);
  CHECK(live_size(a, v) == 40 * kMiB);
  // 50 MiB may take the 64 MiB block (14 MiB over), whole.
  const DevPtr w = must_malloc(a, 50 * kMiB);
  CHECK(w == t);
  CHECK(live_size(a, w) == 64 * kMiB);
  require_invariants(a);
  REQUIRE(a.release_all().ok());
}

TEST_CASE("sma: a block freed on one stream is reused by another only after synchronize()",
          "[sma][stream]") {
  Sim sim;
  Sma a(sim.b);
  const DevPtr p1 = must_malloc(a, 20 * kMiB, kS1);  // a 20 MiB chunk, exactly
  const DevPtr base = a.base();
  must_free(a, p1);
  CHECK(must_malloc(a, 20 * kMiB, kS1) == p1);  // the same stream: at once
  must_free(a, p1);
  const DevPtr q = must_malloc(a, 20 * kMiB, kS2);  // another stream: a new chunk
  CHECK(q == base + 20 * kMiB);
  CHECK(a.stats().reserved_bytes == 40 * kMiB);
  must_free(a, q);
  REQUIRE(a.synchronize().ok());
  CHECK(a.synchronizations() == 1);
  CHECK(must_malloc(a, 20 * kMiB, kS2) == p1);  // both are ready now: the lower one
  CHECK(a.stats().reserved_bytes == 40 * kMiB);
  require_invariants(a);
  REQUIRE(a.release_all().ok());
}

TEST_CASE("sma: neighbours freed on different streams merge at synchronize()", "[sma][stream]") {
  Sim sim;
  Sma a(sim.b);
  const DevPtr x = must_malloc(a, kMiB, kS1);  // small chunk: x + a ready 1 MiB remainder
  const DevPtr y = must_malloc(a, kMiB, kS2);  // fresh memory is ready: any stream takes it
  CHECK(y == x + kMiB);
  must_free(a, x);
  must_free(a, y);
  CHECK(a.cached_blocks() == 2);               // pending on s1 and on s2: not merged
  const DevPtr z = must_malloc(a, kMiB, kS3);  // neither may serve s3
  CHECK(z == x + 2 * kMiB);
  must_free(a, z);  // merges with its ready remainder
  CHECK(a.cached_blocks() == 3);
  require_invariants(a);
  REQUIRE(a.synchronize().ok());
  CHECK(a.cached_blocks() == 2);  // x and y are one 2 MiB block now
  CHECK(a.cached_bytes() == 4 * kMiB);
  CHECK(must_malloc(a, kMiB, kS3) == x);
  require_invariants(a);
  REQUIRE(a.release_all().ok());
}

TEST_CASE("sma: garbage collection releases least recently freed blocks and trims", "[sma][gc]") {
  // Heap 64 MiB, threshold 0.5: collect on a miss while more than 32 MiB is held.
  auto run = [](double threshold, bool free_b_first) {
    Sim sim;
    SmaConfig cfg = heap_of(64 * kMiB);
    cfg.garbage_collection_threshold = threshold;
    Sma a(sim.b, cfg);
    must_malloc(a, 12 * kMiB);  // [0, 12)
    const DevPtr b = must_malloc(a, 12 * kMiB);
    const DevPtr c = must_malloc(a, 12 * kMiB);
    CHECK(a.stats().reserved_bytes == 36 * kMiB);
    must_free(a, free_b_first ? b : c);
    must_free(a, free_b_first ? c : b);
    const DevPtr d = must_malloc(a, 16 * kMiB);  // a miss
    require_invariants(a);
    require_invariants(sim.b);
    CHECK(sim.b.usage().physical_bytes == a.stats().reserved_bytes);
    struct Out {
      uint64_t d_offset, reserved, cached_blocks, gc_runs, segment_releases;
    };
    Out out{d - a.base(), a.stats().reserved_bytes, a.cached_blocks(), a.gc_runs(),
            a.stats().segment_releases};
    REQUIRE(a.release_all().ok());
    return out;
  };
  SECTION("off: the new chunk goes above everything") {
    const auto o = run(0, true);
    CHECK(o.d_offset == 36 * kMiB);
    CHECK(o.reserved == 52 * kMiB);
    CHECK(o.cached_blocks == 2);
    CHECK(o.gc_runs == 0);
  }
  SECTION("on: b then c go back to the heap, the chunk lands in the hole, the tail is unmapped") {
    const auto o = run(0.5, true);
    CHECK(o.d_offset == 12 * kMiB);
    CHECK(o.reserved == 28 * kMiB);
    CHECK(o.cached_blocks == 0);
    CHECK(o.gc_runs == 1);
    CHECK(o.segment_releases == 4);  // granules [28, 36) MiB
  }
  SECTION("on, c freed first: releasing c alone gets under the limit, b stays cached") {
    const auto o = run(0.5, false);
    CHECK(o.d_offset == 24 * kMiB);
    CHECK(o.reserved == 40 * kMiB);
    CHECK(o.cached_blocks == 1);
    CHECK(o.segment_releases == 0);
  }
}

TEST_CASE("sma: vmm maps granules on demand; empty_cache unmaps the free tail", "[sma][vmm]") {
  Sim sim;
  Sma a(sim.b);  // heap = capacity = 256 MiB
  CHECK(a.heap_size() == 256 * kMiB);
  CHECK(sim.b.usage().virtual_reserved == 0);
  const DevPtr x = must_malloc(a, 1000);
  CHECK(sim.b.usage().virtual_reserved == 256 * kMiB);
  CHECK(sim.b.usage().physical_bytes == 2 * kMiB);
  CHECK(sim.b.usage().virtual_mapped == 2 * kMiB);
  CHECK(sim.b.calls_of(P::kCreatePhysical) == 1);
  CHECK(sim.b.calls_of(P::kMap) == 1);
  CHECK(sim.b.calls_of(P::kSetAccess) == 1);
  CHECK(a.stats().reserved_bytes == 2 * kMiB);
  CHECK(a.stats().segments == 1);

  const DevPtr y = must_malloc(a, 3 * kMiB);  // chunk [2, 22) MiB: ten more granules
  CHECK(sim.b.usage().physical_bytes == 22 * kMiB);
  CHECK(sim.b.calls_of(P::kCreatePhysical) == 11);
  CHECK(sim.b.calls_of(P::kMap) == 11);
  CHECK(sim.b.calls_of(P::kSetAccess) == 2);
  CHECK(a.stats().segments == 11);
  CHECK(a.stats().segment_allocs == 11);

  must_free(a, x);
  REQUIRE(a.empty_cache().ok());  // y's free remainder goes; y pins the granules below its end
  CHECK(a.stats().reserved_bytes == 6 * kMiB);
  CHECK(a.heap().used_ranges() == Ranges{{2 * kMiB, 3 * kMiB}});
  must_free(a, y);
  CHECK(a.stats().reserved_bytes == 6 * kMiB);  // cached, still mapped
  CHECK(a.stats().allocated_bytes == 0);
  REQUIRE(a.empty_cache().ok());
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(a.stats().segments == 0);
  CHECK(a.stats().segment_releases == 11);
  CHECK(a.stats().peak_reserved_bytes == 22 * kMiB);
  CHECK(sim.b.calls_of(P::kUnmap) == 11);
  CHECK(sim.b.calls_of(P::kReleasePhysical) == 11);
  CHECK(sim.b.usage().physical_bytes == 0);
  CHECK(sim.b.usage().virtual_reserved == 256 * kMiB);  // the VA stays until release_all
  require_invariants(a);

  // The next malloc maps again from the bottom of the heap.
  CHECK(must_malloc(a, 5 * kMiB) == x);
  CHECK(a.stats().reserved_bytes == 20 * kMiB);
  REQUIRE(a.release_all().ok());
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(a.stats().live_blocks == 0);
  CHECK(a.base() == 0);
  CHECK(sim.b.usage().virtual_reserved == 0);
  CHECK(sim.b.usage().physical_bytes == 0);
  require_invariants(a);
  require_invariants(sim.b);
}

TEST_CASE("sma: the device_malloc region holds heap_size from the first malloc", "[sma][region]") {
  Sim sim;
  Sma a(sim.b, heap_of(32 * kMiB, Region::kDeviceMalloc));
  CHECK(a.stats().reserved_bytes == 0);
  const DevPtr x = must_malloc(a, 1000);
  CHECK(x == a.base());
  CHECK(a.stats().reserved_bytes == 32 * kMiB);
  CHECK(a.stats().segments == 1);
  CHECK(a.stats().segment_allocs == 1);
  CHECK(sim.b.usage().physical_bytes == 32 * kMiB);
  CHECK(sim.b.calls_of(P::kDeviceMalloc) == 1);
  CHECK(sim.b.calls_of(P::kCreatePhysical) == 0);
  const DevPtr y = must_malloc(a, 3 * kMiB);
  CHECK(y == x + 2 * kMiB);
  must_free(a, x);
  must_free(a, y);
  REQUIRE(a.empty_cache().ok());
  CHECK(a.heap().used_bytes() == 0);
  CHECK(a.stats().reserved_bytes == 32 * kMiB);  // one allocation: it never shrinks
  require_invariants(a);
  auto big = a.malloc(33 * kMiB, kS0);
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().code == ErrorCode::kOutOfMemory);
  CHECK(big.error().bytes_short == kMiB);
  REQUIRE(a.release_all().ok());
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(a.stats().segment_releases == 1);
  CHECK(a.stats().ooms == 1);
  CHECK(sim.b.usage().physical_bytes == 0);
  require_invariants(sim.b);

  // A region larger than the device: the first malloc fails and leaves nothing behind.
  Sma huge(sim.b, heap_of(512 * kMiB, Region::kDeviceMalloc));
  auto r = huge.malloc(kMiB, kS0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::kOutOfMemory);
  AllocatorStats expect;
  expect.ooms = 1;
  CHECK(same_stats(huge.stats(), expect));
  CHECK(sim.b.usage().physical_bytes == 0);
  require_invariants(huge);
}

TEST_CASE("sma: out of memory changes nothing the caller sees", "[sma][oom]") {
  SECTION("the heap is full even after the cache went back to it") {
    Sim sim;
    Sma a(sim.b, heap_of(64 * kMiB));
    must_malloc(a, 40 * kMiB);                   // [0, 40)
    const DevPtr b = must_malloc(a, 20 * kMiB);  // [40, 60)
    must_free(a, b);
    const AllocatorStats before = a.stats();
    auto r = a.malloc(30 * kMiB, kS0);  // the cache returns b; 24 MiB is the most there is
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == ErrorCode::kOutOfMemory);
    CHECK(r.error().bytes_short == 6 * kMiB);
    AllocatorStats expect = before;
    expect.ooms = 1;
    CHECK(same_stats(a.stats(), expect));
    CHECK(sim.b.usage().physical_bytes == 60 * kMiB);
    require_invariants(a);
    CHECK(must_malloc(a, 24 * kMiB) == b);  // what there is still serves
    CHECK(a.stats().reserved_bytes == 64 * kMiB);
    require_invariants(a);
    REQUIRE(a.release_all().ok());
  }
  SECTION("a 20 MiB chunk does not fit but the request does: an exact chunk") {
    Sim sim;
    Sma a(sim.b, heap_of(64 * kMiB));
    must_malloc(a, 50 * kMiB);
    const DevPtr p = must_malloc(a, 3 * kMiB);
    CHECK(p == a.base() + 50 * kMiB);
    CHECK(live_size(a, p) == 3 * kMiB);
    CHECK(a.stats().reserved_bytes == 54 * kMiB);
    CHECK(a.stats().ooms == 0);
    require_invariants(a);
    REQUIRE(a.release_all().ok());
  }
  SECTION("the device runs out of physical memory while the heap grows") {
    Sim sim(64 * kMiB);
    Sma a(sim.b, heap_of(128 * kMiB));
    must_malloc(a, 40 * kMiB);
    const AllocatorStats before = a.stats();
    const uint64_t creates = sim.b.calls_of(P::kCreatePhysical);
    auto r = a.malloc(30 * kMiB, kS0);  // 12 granules made, the 13th fails: all rolled back
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == ErrorCode::kOutOfMemory);
    CHECK(r.error().bytes_short == kG);
    CHECK(sim.b.calls_of(P::kCreatePhysical) - creates == 13);
    AllocatorStats expect = before;
    expect.ooms = 1;
    CHECK(same_stats(a.stats(), expect));
    CHECK(sim.b.usage().physical_bytes == 40 * kMiB);
    require_invariants(a);
    require_invariants(sim.b);
    REQUIRE(a.release_all().ok());
  }
  SECTION("a failed first malloc gives the VA reservation back") {
    Sim sim(64 * kMiB);
    Sma a(sim.b, heap_of(128 * kMiB));
    auto r = a.malloc(100 * kMiB, kS0);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == ErrorCode::kOutOfMemory);
    AllocatorStats expect;
    expect.ooms = 1;
    CHECK(same_stats(a.stats(), expect));
    CHECK(a.base() == 0);
    CHECK(sim.b.usage().virtual_reserved == 0);
    CHECK(sim.b.usage().physical_bytes == 0);
    require_invariants(a);
  }
}

TEST_CASE("sma: misuse returns errors and changes nothing", "[sma]") {
  Sim sim;
  Sma a(sim.b);
  CHECK(a.malloc(0, kS0).error().code == ErrorCode::kInvalidArgument);
  CHECK(a.free(0).error().code == ErrorCode::kInvalidArgument);
  const DevPtr p = must_malloc(a, 4 * kK);
  const AllocatorStats before = a.stats();
  CHECK(a.free(p + 512).error().code == ErrorCode::kInvalidArgument);  // inside a block
  CHECK(a.free(0x1234).error().code == ErrorCode::kInvalidArgument);
  CHECK(same_stats(a.stats(), before));
  must_free(a, p);
  CHECK(a.free(p).error().code == ErrorCode::kInvalidArgument);  // double free
  CHECK(a.stats().allocated_bytes == 0);
  CHECK(a.stats().ooms == 0);
  require_invariants(a);
  REQUIRE(a.release_all().ok());
}

TEST_CASE("sma: the registry parses its keys and rejects bad values", "[sma][registry]") {
  const AllocatorEntry* info = caching_allocators().find("sma");
  REQUIRE(info != nullptr);
  CHECK(info->keys == std::vector<std::string>{"region", "heap_size", "max_split_size",
                                               "garbage_collection_threshold",
                                               "base_addr_aligned"});
  const ConfigNode node = ConfigNode::parse(
      "{region: device_malloc, heap_size: 32MiB, max_split_size: 64MiB, "
      "garbage_collection_threshold: 0.5, base_addr_aligned: 4KiB}",
      "test");
  Sim sim;
  const std::unique_ptr<CachingAllocator> made = info->parse(node)(sim.b);
  const auto* s = dynamic_cast<const Sma*>(made.get());
  REQUIRE(s != nullptr);
  CHECK(s->config().region == Region::kDeviceMalloc);
  CHECK(s->heap_size() == 32 * kMiB);
  CHECK(s->config().max_split_size == 64 * kMiB);
  CHECK(s->config().garbage_collection_threshold == 0.5);
  CHECK(s->config().base_addr_aligned == 4 * kK);
  const auto defaults = info->parse(ConfigNode::parse("{}", "test"))(sim.b);
  CHECK(dynamic_cast<const Sma*>(defaults.get())->config().region == Region::kVmm);
  for (const char* bad :
       {"{region: shmem}", "{max_split_size: 20MiB}", "{garbage_collection_threshold: 1}",
        "{garbage_collection_threshold: -0.1}", "{base_addr_aligned: 1000}",
        "{base_addr_aligned: 256}", "{heap_size: 2PiB}"}) {
    INFO(bad);
    CHECK_THROWS_AS(info->parse(ConfigNode::parse(bad, "test")), ConfigError);
  }
}

namespace {

// Ranges freed on a stream since the last synchronization (caller's view: [p, p + rounded)).
// A malloc on another stream must not return any part of one.
class PendingShadow {
 public:
  void add(uint64_t start, uint64_t end, uint32_t stream) {
    erase(start, end);
    ranges_.emplace(start, Range{end, stream});
  }
  // Whether [start, end) overlaps a range pending on a stream other than `stream`.
  bool conflicts(uint64_t start, uint64_t end, uint32_t stream) const {
    auto it = ranges_.upper_bound(start);
    if (it != ranges_.begin()) --it;
    for (; it != ranges_.end() && it->first < end; ++it)
      if (it->second.end > start && it->second.stream != stream) return true;
    return false;
  }
  void erase(uint64_t start, uint64_t end) {
    auto it = ranges_.upper_bound(start);
    if (it != ranges_.begin()) --it;
    while (it != ranges_.end() && it->first < end) {
      const uint64_t s = it->first;
      const Range r = it->second;
      if (r.end <= start) {
        ++it;
        continue;
      }
      it = ranges_.erase(it);
      if (s < start) ranges_.emplace(s, Range{start, r.stream});
      if (r.end > end) ranges_.emplace(end, Range{r.end, r.stream});
    }
  }
  void clear() { ranges_.clear(); }

 private:
  struct Range {
    uint64_t end;
    uint32_t stream;
  };
  std::map<uint64_t, Range> ranges_;
};

void fuzz(SmaConfig cfg, uint64_t capacity, uint32_t seed) {
  Sim sim(capacity);
  Sma a(sim.b, cfg);
  std::mt19937_64 rng(seed);
  std::map<DevPtr, uint64_t> live;  // ptr -> requested
  std::vector<DevPtr> order;        // live pointers, for random frees
  std::map<DevPtr, uint32_t> stream_of;
  PendingShadow pending;
  uint64_t ooms = 0, mallocs = 0;
  auto size_of = [&]() -> uint64_t {
    const uint64_t pick = rng() % 100;
    if (pick < 60) return 1 + rng() % kMiB;
    if (pick < 90) return kMiB + 1 + rng() % (9 * kMiB);
    return 10 * kMiB + rng() % (30 * kMiB);
  };
  for (int op = 0; op < 100000; ++op) {
    // Phases of 4000 ops alternately fill the heap (to out of memory) and drain it.
    const bool filling = (op / 4000) % 2 == 0;
    const uint64_t pick = rng() % 1000;
    if (pick < (filling ? 600u : 380u)) {
      const uint64_t bytes = size_of();
      const StreamId stream{static_cast<uint32_t>(rng() % 3)};
      const AllocatorStats before = a.stats();
      const uint64_t syncs = a.synchronizations();
      auto r = a.malloc(bytes, stream);
      if (a.synchronizations() != syncs) pending.clear();
      if (!r.ok()) {
        REQUIRE(r.error().code == ErrorCode::kOutOfMemory);
        AllocatorStats expect = before;
        ++expect.ooms;
        REQUIRE(same_stats(a.stats(), expect));
        ++ooms;
        continue;
      }
      ++mallocs;
      const DevPtr p = *r;
      const uint64_t end = p + Sma::round_size(bytes);
      REQUIRE(p >= a.base());
      REQUIRE(end <= a.base() + a.heap_size());
      auto next = live.lower_bound(p);
      if (next != live.end()) REQUIRE(next->first >= end);
      if (next != live.begin()) {
        auto prev = std::prev(next);
        REQUIRE(prev->first + Sma::round_size(prev->second) <= p);
      }
      REQUIRE_FALSE(pending.conflicts(p, end, stream.id));
      pending.erase(p, end);
      live.emplace(p, bytes);
      stream_of[p] = stream.id;
      order.push_back(p);
    } else if (pick < 970 && !order.empty()) {
      const size_t k = rng() % order.size();
      const DevPtr p = order[k];
      order[k] = order.back();
      order.pop_back();
      REQUIRE(a.free(p).ok());
      pending.add(p, p + Sma::round_size(live.at(p)), stream_of.at(p));
      live.erase(p);
    } else if (pick < 990) {
      REQUIRE(a.synchronize().ok());
      pending.clear();
    } else if (pick < 995) {
      REQUIRE(a.empty_cache().ok());
      pending.clear();
      if (cfg.region == Region::kVmm)
        REQUIRE(a.stats().reserved_bytes ==
                (a.heap().used_end() + kG - 1) / kG * kG);  // the tail is unmapped
    }
    if (op % 64 == 0) {
      require_invariants(a);
      REQUIRE(a.stats().live_blocks == live.size());
      REQUIRE(sim.b.usage().physical_bytes == a.stats().reserved_bytes);
    }
  }
  require_invariants(a);
  require_invariants(sim.b);
  INFO("mallocs " << mallocs << ", ooms " << ooms << ", gc runs " << a.gc_runs());
  CHECK(mallocs > 10000);
  CHECK(ooms > 0);
  REQUIRE(a.release_all().ok());
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(a.stats().segment_allocs == a.stats().segment_releases);
  CHECK(sim.b.usage().physical_bytes == 0);
  CHECK(sim.b.usage().virtual_reserved == 0);
  require_invariants(a);
  require_invariants(sim.b);
}

}  // namespace

TEST_CASE("sma: fuzzing keeps the invariants and gives everything back", "[sma][fuzz]") {
  SECTION("vmm, defaults") {
    fuzz(heap_of(256 * kMiB), 256 * kMiB, 1);
  }
  SECTION("vmm, GC, max_split_size, 4 KiB alignment, heap over the device") {
    SmaConfig cfg = heap_of(384 * kMiB);
    cfg.garbage_collection_threshold = 0.6;
    cfg.max_split_size = 32 * kMiB;
    cfg.base_addr_aligned = 4 * kK;
    fuzz(cfg, 256 * kMiB, 2);
  }
  SECTION("device_malloc, GC") {
    SmaConfig cfg = heap_of(192 * kMiB, Region::kDeviceMalloc);
    cfg.garbage_collection_threshold = 0.5;
    fuzz(cfg, 256 * kMiB, 3);
  }
}

}  // namespace memsim
