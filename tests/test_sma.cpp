// Tests of Sma and its MemoryHeap: best fit, coalescing, split rules, stream-aware reuse, GC,
// VMM growth and trimming, the device_malloc region, out of memory, misuse (fuzzing:
// test_sma_fuzz.cpp).
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
#include "tests/sma_test_util.h"

namespace memsim {
using namespace sma_test;

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

// cross_stream: sync (and merge: eager), the model before the seed's events.
SmaConfig sync_eager() {
  SmaConfig c;
  c.cross_stream = SmaConfig::CrossStream::kSync;
  c.merge = SmaConfig::Merge::kEager;
  return c;
}

TEST_CASE(
    "sma: under cross_stream sync a block freed on one stream is reused by another only "
    "after synchronize()",
    "[sma][stream]") {
  Sim sim;
  Sma a(sim.b, sync_eager());
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

TEST_CASE(
    "sma: under cross_stream sync and merge eager, neighbours freed on different streams "
    "merge at synchronize()",
    "[sma][stream]") {
  Sim sim;
  Sma a(sim.b, sync_eager());
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

// The seed's stream synchronization (§6.3): a block freed on s1 serves s2 at once, s2 waiting
// on the event recorded on s1; s1's own reuse waits on nothing. A synchronization clears the
// events.
TEST_CASE(
    "sma: under cross_stream event another stream reuses a block at once, waiting on its "
    "event",
    "[sma][stream]") {
  Sim sim;
  Sma a(sim.b);
  REQUIRE(a.config().cross_stream == SmaConfig::CrossStream::kEvent);
  const DevPtr p1 = must_malloc(a, 20 * kMiB, kS1);
  must_free(a, p1);
  CHECK(must_malloc(a, 20 * kMiB, kS1) == p1);
  CHECK(a.event_waits() == 0);
  must_free(a, p1);
  CHECK(must_malloc(a, 20 * kMiB, kS2) == p1);  // no new chunk
  CHECK(a.event_waits() == 1);
  CHECK(a.stats().reserved_bytes == 20 * kMiB);
  must_free(a, p1);
  REQUIRE(a.synchronize().ok());
  CHECK(must_malloc(a, 20 * kMiB, kS3) == p1);
  CHECK(a.event_waits() == 1);  // the synchronization ordered it
  require_invariants(a);
  REQUIRE(a.release_all().ok());
}

// The seed's merging (§4.3): a freed block stays as it is; neighbours merge when the cache goes
// back to the heap. x and y (6 MiB each) split a 20 MiB chunk (8 MiB left cached); both freed,
// merge gc caches 6 + 6 + 8 MiB apart, so 15 MiB finds no block and takes a second chunk (16
// MiB, 36 MiB reserved), where merge eager has one 20 MiB block and splits it (x again, 20 MiB
// reserved). empty_cache() then merges what is cached and returns it: the heap's used end is
// z's, 36 MiB (gc: the free first chunk below it stays mapped) or 15 MiB (16 in granules).
TEST_CASE("sma: merge gc leaves freed neighbours apart until memory goes back to the heap",
          "[sma][gc]") {
  for (const auto merge : {SmaConfig::Merge::kGc, SmaConfig::Merge::kEager}) {
    const bool gc = merge == SmaConfig::Merge::kGc;
    INFO((gc ? "gc" : "eager"));
    Sim sim;
    SmaConfig cfg;
    cfg.merge = merge;
    Sma a(sim.b, cfg);
    const DevPtr x = must_malloc(a, 6 * kMiB, kS1);
    const DevPtr y = must_malloc(a, 6 * kMiB, kS1);
    REQUIRE(y == x + 6 * kMiB);
    must_free(a, x);
    must_free(a, y);
    CHECK(a.cached_blocks() == (gc ? 3u : 1u));
    require_invariants(a);
    const DevPtr z = must_malloc(a, 15 * kMiB, kS1);
    CHECK(z == (gc ? x + 20 * kMiB : x));
    CHECK(a.stats().reserved_bytes == (gc ? 36 : 20) * kMiB);
    require_invariants(a);
    REQUIRE(a.empty_cache().ok());
    CHECK(a.cached_blocks() == 0);
    CHECK(a.stats().reserved_bytes == (gc ? 36 : 16) * kMiB);  // z's chunk ends at 36 MiB
    require_invariants(a);
    must_free(a, z);
    REQUIRE(a.release_all().ok());
  }
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
                                               "garbage_collection_threshold", "base_addr_aligned",
                                               "cross_stream", "merge"});
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

}  // namespace memsim
