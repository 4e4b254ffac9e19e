// Sma under 100,000 random mallocs, frees, synchronizations and cache flushes on three streams,
// in each region, merging and cross-stream mode: the invariants hold, no two live blocks
// overlap, memory freed on another stream is reused only as the mode allows, and everything
// comes back.
#include <catch2/catch.hpp>

#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "tests/sma_test_util.h"

namespace memsim {
using namespace sma_test;

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
  uint64_t ooms = 0, mallocs = 0, cross_stream_reuses = 0;
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
      const uint64_t syncs = a.synchronizations(), waits = a.event_waits();
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
      // Memory freed on another stream since the last synchronization: kSync never hands it
      // out; kEvent does, waiting on its event.
      if (cfg.cross_stream == SmaConfig::CrossStream::kSync) {
        REQUIRE_FALSE(pending.conflicts(p, end, stream.id));
        REQUIRE(a.event_waits() == 0);
      } else if (pending.conflicts(p, p + live_size(a, p), stream.id)) {
        // The whole block counts: an unsplit remainder past the request was freed there too.
        REQUIRE(a.event_waits() == waits + 1);
        ++cross_stream_reuses;
      }
      pending.erase(p, p + live_size(a, p));
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
  if (cfg.cross_stream == SmaConfig::CrossStream::kEvent) CHECK(cross_stream_reuses > 100);
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
  SECTION("vmm, cross_stream sync, merge eager (PyTorch's reuse and merging)") {
    SmaConfig cfg = heap_of(256 * kMiB);
    cfg.cross_stream = SmaConfig::CrossStream::kSync;
    cfg.merge = SmaConfig::Merge::kEager;
    fuzz(cfg, 256 * kMiB, 4);
  }
  SECTION("vmm, GC, cross_stream event, merge eager") {
    SmaConfig cfg = heap_of(256 * kMiB);
    cfg.garbage_collection_threshold = 0.7;
    cfg.merge = SmaConfig::Merge::kEager;
    fuzz(cfg, 256 * kMiB, 5);
  }
}

}  // namespace memsim
