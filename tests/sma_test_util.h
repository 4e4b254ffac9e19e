// Shared by the SMA tests (test_sma.cpp, test_sma_fuzz.cpp): a small simulated GPU, configs and
// checked calls.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "src/alloc/sma.h"

namespace memsim::sma_test {

inline constexpr uint64_t kK = 1ull << 10;
inline constexpr uint64_t kMiB = 1ull << 20;
inline constexpr uint64_t kG = 2 * kMiB;  // granularity
inline constexpr StreamId kS0{0};
inline constexpr StreamId kS1{1};
inline constexpr StreamId kS2{2};
inline constexpr StreamId kS3{3};
using Region = SmaConfig::Region;
using P = Primitive;

inline GpuSpec test_gpu(uint64_t capacity) {
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

inline SmaConfig heap_of(uint64_t bytes, Region region = Region::kVmm) {
  SmaConfig c;
  c.heap_size = bytes;
  c.region = region;
  return c;
}

inline void require_invariants(const Sma& a) {
  std::string why;
  const bool ok = a.check_invariants(&why);
  INFO(why);
  REQUIRE(ok);
}

inline void require_invariants(const MemoryHeap& h) {
  std::string why;
  const bool ok = h.check_invariants(&why);
  INFO(why);
  REQUIRE(ok);
}

inline void require_invariants(const SimBackend& b) {
  std::string why;
  const bool ok = b.check_invariants(&why);
  INFO(why);
  REQUIRE(ok);
}

inline DevPtr must_malloc(Sma& a, uint64_t bytes, StreamId s = kS0) {
  auto r = a.malloc(bytes, s);
  INFO((r.ok() ? std::string() : r.error().message));
  REQUIRE(r.ok());
  return *r;
}

inline void must_free(Sma& a, DevPtr p) {
  REQUIRE(a.free(p).ok());
}

inline uint64_t live_size(const Sma& a, DevPtr p) {
  for (const LiveBlock& b : a.live_blocks())
    if (b.ptr == p) return b.size;
  return 0;
}

inline bool same_stats(const AllocatorStats& x, const AllocatorStats& y) {
  return x.reserved_bytes == y.reserved_bytes && x.peak_reserved_bytes == y.peak_reserved_bytes &&
         x.allocated_bytes == y.allocated_bytes &&
         x.peak_allocated_bytes == y.peak_allocated_bytes &&
         x.requested_bytes == y.requested_bytes && x.segments == y.segments &&
         x.live_blocks == y.live_blocks && x.segment_allocs == y.segment_allocs &&
         x.segment_releases == y.segment_releases && x.ooms == y.ooms;
}

// Idle ranges as offset -> size, for exact comparisons.
using Ranges = std::map<uint64_t, uint64_t>;

}  // namespace memsim::sma_test
