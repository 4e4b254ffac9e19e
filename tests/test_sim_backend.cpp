// Exact-number tests of SimBackend accounting, graph memory, errors, faults and time.
#include <catch2/catch.hpp>

#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "tests/sim_backend_test_util.h"

namespace memsim {
namespace {

using namespace test;  // NOLINT(google-build-using-namespace)

constexpr ErrorCode kInvArg = ErrorCode::kInvalidArgument;
constexpr ErrorCode kInvState = ErrorCode::kInvalidState;
constexpr ErrorCode kOom = ErrorCode::kOutOfMemory;

bool invariants(const SimBackend& b) {
  std::string why;
  const bool ok = b.check_invariants(&why);
  INFO("check_invariants: " << why);
  CHECK(ok);
  return ok;
}

template <class R>
ErrorCode err(const R& r) {
  REQUIRE_FALSE(r.ok());
  return r.error().code;
}

bool same_usage(const Usage& a, const Usage& b) {
  return a.physical_bytes == b.physical_bytes && a.virtual_reserved == b.virtual_reserved &&
         a.virtual_mapped == b.virtual_mapped && a.graph_mem_reserved == b.graph_mem_reserved &&
         a.graph_mem_used == b.graph_mem_used && a.pinned_host_bytes == b.pinned_host_bytes &&
         a.per_tag == b.per_tag;
}

// Physical, reserved and mapped bytes; checks invariants too.
void usage_is(const SimBackend& b, uint64_t physical, uint64_t reserved, uint64_t mapped) {
  invariants(b);
  const Usage u = b.usage();
  CHECK(u.physical_bytes == physical);
  CHECK(u.virtual_reserved == reserved);
  CHECK(u.virtual_mapped == mapped);
}

// Graph memory reserved and used, with no other physical memory held. Checks invariants too.
void graph_is(const SimBackend& b, uint64_t reserved, uint64_t used) {
  invariants(b);
  const Usage u = b.usage();
  CHECK(u.graph_mem_reserved == reserved);
  CHECK(u.graph_mem_used == used);
  CHECK(u.physical_bytes == reserved);
  CHECK(u.per_tag.count("graph_mem") == (reserved ? 1u : 0u));
  if (reserved) CHECK(u.per_tag.at("graph_mem") == reserved);
}

TEST_CASE_METHOD(Sim, "create_physical: granularity rule, exact bytes and tags, OOM",
                 "[sim_backend]") {
  CHECK(b.granularity() == kG);
  CHECK(b.capacity() == kCap);
  CHECK(err(b.create_physical(0, "a")) == kInvArg);
  CHECK(err(b.create_physical(3 * kMiB, "a")) == kInvArg);
  CHECK(err(b.create_physical(kG + 4096, "a")) == kInvArg);
  CHECK(same_usage(b.usage(), Usage{}));

  const PhysHandle h1 = *b.create_physical(4 * kMiB, "a");
  const PhysHandle h2 = *b.create_physical(2 * kMiB, "b");
  const PhysHandle h3 = *b.create_physical(6 * kMiB, "a");
  usage_is(b, 12 * kMiB, 0, 0);
  CHECK(b.usage().per_tag ==
        std::map<std::string, uint64_t, std::less<>>{{"a", 10 * kMiB}, {"b", 2 * kMiB}});
  CHECK(metrics.peak("physical_bytes") == 12.0 * kMiB);
  CHECK(metrics.last(metrics.series("tag.a")) == 10.0 * kMiB);
  invariants(b);

  SECTION("capacity exhaustion reports the exact shortfall and changes nothing") {
    const Usage before = b.usage();
    auto r = b.create_physical(54 * kMiB, "big");
    CHECK(err(r) == kOom);
    CHECK(r.error().bytes_short == 2 * kMiB);
    CHECK(same_usage(b.usage(), before));
    REQUIRE(b.create_physical(52 * kMiB, "big").ok());  // exactly full
    auto r2 = b.create_physical(kG, "x");
    CHECK(err(r2) == kOom);
    CHECK(r2.error().bytes_short == kG);
    auto r3 = b.create_physical(2 * kCap, "x");  // larger than the device
    CHECK(err(r3) == kOom);
    CHECK(r3.error().bytes_short == 2 * kCap);
    CHECK(b.usage().physical_bytes == kCap);
    invariants(b);
  }
  SECTION("release twice is an error and leaves the state unchanged") {
    REQUIRE(b.release_physical(h2).ok());
    const Usage after = b.usage();
    CHECK(after.physical_bytes == 10 * kMiB);
    CHECK(after.per_tag.count("b") == 0);
    CHECK(err(b.release_physical(h2)) == kInvState);
    CHECK(err(b.release_physical(PhysHandle{999})) == kInvState);
    CHECK(same_usage(b.usage(), after));
    invariants(b);
    REQUIRE((b.release_physical(h1).ok() && b.release_physical(h3).ok()));
    CHECK(same_usage(b.usage(), Usage{}));
    CHECK(metrics.last(metrics.series("physical_bytes")) == 0);
  }
}

// The GPU file's context term: memory the CUDA context holds before the first allocation. It
// counts against the capacity for every kind of allocation and never shows in usage().
TEST_CASE("the CUDA context's bytes count against the capacity, never in usage", "[sim_backend]") {
  GpuSpec g = test_gpu();
  g.context = 10 * kMiB;
  SimClock clock;
  SimBackend b(g, clock);
  CHECK(b.capacity() == kCap);
  REQUIRE(b.create_physical(50 * kMiB, "a").ok());  // 60 of 64 MiB not free
  CHECK(b.usage().physical_bytes == 50 * kMiB);
  const auto over = b.device_malloc(6 * kMiB, "b");  // rounds to 6 MiB: 2 MiB short
  REQUIRE(err(over) == kOom);
  CHECK(over.error().bytes_short == 2 * kMiB);
  CHECK_THAT(over.error().message, Catch::Contains("the CUDA context's 10.0 MiB included"));
  REQUIRE(b.device_malloc(4 * kMiB, "b").ok());  // exactly full
  CHECK(err(b.malloc_async(1, StreamId{0})) == kOom);
  CHECK(b.usage().physical_bytes == 54 * kMiB);
  std::string why;
  CHECK(b.check_invariants(&why));
}

TEST_CASE("fault injection fails exactly the k-th call", "[sim_backend][faults]") {
  Sim s({FaultInjection{P::kCreatePhysical, 3}});
  for (int i = 1; i <= 5; ++i) {
    auto r = s.b.create_physical(kG, "f");
    CHECK(r.ok() == (i != 3));
    if (i == 3) CHECK(err(r) == kOom);
  }
  CHECK(s.b.usage().physical_bytes == 4 * kG);
  CHECK(s.b.calls_of(P::kCreatePhysical) == 5);
  invariants(s.b);
  Sim r({FaultInjection{P::kMap, 2, 2}});  // repeat: calls 2 and 3 fail
  const DevPtr va = *r.b.reserve_virtual(8 * kMiB, 0);
  const PhysHandle h = *r.b.create_physical(kG, "f");
  for (uint64_t i = 0; i < 4; ++i) CHECK(r.b.map(va + i * kG, kG, h, 0).ok() == (i == 0 || i == 3));
  usage_is(r.b, kG, 8 * kMiB, 2 * kG);
}

TEST_CASE_METHOD(Sim, "reserve/map/unmap/set_access rules, aliasing and deferred release",
                 "[sim_backend][vmm]") {
  CHECK(err(b.reserve_virtual(0, 0)) == kInvArg);
  CHECK(err(b.reserve_virtual(3 * kMiB, 0)) == kInvArg);
  const DevPtr va = *b.reserve_virtual(8 * kMiB, 0);
  CHECK(va % kG == 0);
  const DevPtr aligned = *b.reserve_virtual(kG, 1ull << 30);
  CHECK(aligned % (1ull << 30) == 0);
  REQUIRE(b.free_virtual(aligned).ok());

  const PhysHandle h = *b.create_physical(4 * kMiB, "w");
  usage_is(b, 4 * kMiB, 8 * kMiB, 0);
  // Outside a reservation, misaligned, zero, beyond the handle, unknown handle.
  CHECK(err(b.map(va + 8 * kMiB, kG, h, 0)) == kInvArg);
  CHECK(err(b.map(va + 6 * kMiB, 4 * kMiB, h, 0)) == kInvArg);
  CHECK(err(b.map(va - kG, kG, h, 0)) == kInvArg);
  CHECK(err(b.map(va + kMiB, kG, h, 0)) == kInvArg);
  CHECK(err(b.map(va, kMiB, h, 0)) == kInvArg);
  CHECK(err(b.map(va, kG, h, kMiB)) == kInvArg);
  CHECK(err(b.map(va, 0, h, 0)) == kInvArg);
  CHECK(err(b.map(va, 4 * kMiB, h, kG)) == kInvArg);
  CHECK(err(b.map(va, kG, PhysHandle{12345}, 0)) == kInvArg);
  usage_is(b, 4 * kMiB, 8 * kMiB, 0);

  REQUIRE(b.map(va, 4 * kMiB, h, 0).ok());
  // Over an existing mapping: same start, inside, and overlapping its tail.
  CHECK(err(b.map(va, kG, h, 0)) == kInvState);
  CHECK(err(b.map(va + kG, kG, h, 0)) == kInvState);
  CHECK(err(b.map(va + kG, 4 * kMiB, h, 0)) == kInvState);
  usage_is(b, 4 * kMiB, 8 * kMiB, 4 * kMiB);

  // A second alias of the same handle: physical counted once, mapped VA twice.
  const DevPtr va2 = *b.reserve_virtual(4 * kMiB, 0);
  REQUIRE(b.map(va2, 4 * kMiB, h, 0).ok());
  usage_is(b, 4 * kMiB, 12 * kMiB, 8 * kMiB);
  for (DevPtr base : {va, va2}) {
    auto r = b.resolve(base + 3 * kMiB + 5);
    REQUIRE(r.has_value());
    CHECK(r->handle == h);
    CHECK(r->offset == 3 * kMiB + 5);
  }
  CHECK_FALSE(b.resolve(va + 4 * kMiB).has_value());  // reserved, not mapped
  CHECK_FALSE(b.resolve(va2 + 4 * kMiB).has_value());
  CHECK_FALSE(b.resolve(0).has_value());

  CHECK(b.set_access(va, 4 * kMiB).ok());
  CHECK(err(b.set_access(va + 4 * kMiB, kG)) == kInvState);
  CHECK(err(b.set_access(va, 6 * kMiB)) == kInvState);

  // Unmap of an unmapped range or of part of a mapping; free_virtual while mapped.
  const Usage mid = b.usage();
  CHECK(err(b.unmap(va + 4 * kMiB, kG)) == kInvState);
  CHECK(err(b.unmap(va, kG)) == kInvState);
  CHECK(err(b.unmap(va + kG, kG)) == kInvState);
  CHECK(err(b.unmap(va, 6 * kMiB)) == kInvState);
  CHECK(err(b.free_virtual(va)) == kInvState);
  CHECK(err(b.free_virtual(va + kG)) == kInvArg);  // not a reservation base
  CHECK(same_usage(b.usage(), mid));
  invariants(b);

  // Release while mapped: deferred until the last unmap.
  REQUIRE(b.release_physical(h).ok());
  CHECK(b.usage().physical_bytes == 4 * kMiB);
  CHECK(err(b.release_physical(h)) == kInvState);
  CHECK(err(b.map(va + 4 * kMiB, kG, h, 0)) == kInvArg);
  REQUIRE(b.unmap(va, 4 * kMiB).ok());
  usage_is(b, 4 * kMiB, 12 * kMiB, 4 * kMiB);
  CHECK(b.usage().per_tag.at("w") == 4 * kMiB);
  invariants(b);
  REQUIRE(b.unmap(va2, 4 * kMiB).ok());
  usage_is(b, 0, 12 * kMiB, 0);
  CHECK(b.usage().per_tag.empty());
  invariants(b);
  REQUIRE((b.free_virtual(va).ok() && b.free_virtual(va2).ok()));
  CHECK(err(b.free_virtual(va)) == kInvArg);
  CHECK(same_usage(b.usage(), Usage{}));

  SECTION("one unmap over adjacent mappings of two handles is priced per handle") {
    const DevPtr v = *b.reserve_virtual(8 * kMiB, 0);
    const PhysHandle a = *b.create_physical(2 * kMiB, "x");
    const PhysHandle c = *b.create_physical(4 * kMiB, "x");
    REQUIRE((b.map(v, 2 * kMiB, a, 0).ok() && b.map(v + 2 * kMiB, 4 * kMiB, c, 0).ok()));
    CHECK(b.resolve(v + 2 * kMiB + 7)->handle == c);
    CHECK(b.resolve(v + 2 * kMiB + 7)->offset == 7);
    // 2 handles x 16 us + 3 granules x 0.5 us.
    expect_cost(b, P::kUnmap, 33500, [&] { REQUIRE(b.unmap(v, 6 * kMiB).ok()); });
    usage_is(b, 6 * kMiB, 8 * kMiB, 0);
  }
}

TEST_CASE_METHOD(Sim, "range and size validation edge cases", "[sim_backend][bug]") {
  const DevPtr va = *b.reserve_virtual(8 * kMiB, 0);
  const PhysHandle h = *b.create_physical(2 * kMiB, "x");
  const PhysHandle h4 = *b.create_physical(4 * kMiB, "x");
  REQUIRE(b.map(va, 2 * kMiB, h, 0).ok());
  REQUIRE(b.map(va + 4 * kMiB, 4 * kMiB, h4, 0).ok());
  SECTION("partial mappings are not supported, as with cuMemMap") {
    const PhysHandle h6 = *b.create_physical(6 * kMiB, "y");
    const DevPtr va2 = *b.reserve_virtual(8 * kMiB, 0);
    CHECK(err(b.map(va2, 2 * kMiB, h6, 0)) == ErrorCode::kNotSupported);
    CHECK(err(b.map(va2, 4 * kMiB, h6, 2 * kMiB)) == ErrorCode::kNotSupported);
    CHECK(b.map(va2, 6 * kMiB, h6, 0).ok());
  }
  SECTION("set_access over a range with an unmapped hole fails") {
    // [va+2, va+4) MiB is unmapped, but the touched mappings' sizes (2 + 4) equal the 6 MiB asked.
    CHECK_FALSE(b.set_access(va, 6 * kMiB).ok());
  }
  SECTION("map rejects a size that wraps around 2^64") {
    // 2^64 - 2 MiB is granularity-aligned; offset + bytes and va - base + bytes wrap to 0.
    CHECK_FALSE(b.map(va + 2 * kMiB, 0 - kG, h4, kG).ok());
    CHECK(b.usage().virtual_mapped == 6 * kMiB);
  }
  SECTION("misaligned unmap and set_access are kInvalidArgument (Backend contract)") {
    CHECK(err(b.unmap(va + kMiB, kG)) == kInvArg);
    CHECK(err(b.set_access(va + 4 * kMiB, 3 * kMiB)) == kInvArg);
  }
  SECTION("a device_malloc larger than the device is kOutOfMemory, not a wrapped 0-byte size") {
    CHECK(err(b.device_malloc(UINT64_MAX, "huge")) == kOom);  // round_up wraps to 0
  }
}

TEST_CASE_METHOD(Sim, "device_malloc rounds to granularity; bad device_free errors",
                 "[sim_backend]") {
  CHECK(err(b.device_malloc(0, "d")) == kInvArg);
  const DevPtr p1 = *b.device_malloc(1, "d");
  const DevPtr p2 = *b.device_malloc(kG + 1, "d");
  const DevPtr p3 = *b.device_malloc(kG, "e");
  CHECK((p1 % kG == 0 && p2 % kG == 0 && p3 % kG == 0));
  usage_is(b, 8 * kMiB, 0, 8 * kMiB);
  const Usage u = b.usage();
  CHECK(u.per_tag.at("d") == 6 * kMiB);
  CHECK(u.per_tag.at("e") == 2 * kMiB);
  invariants(b);
  auto oom = b.device_malloc(57 * kMiB, "big");  // rounds to 58 MiB: 2 MiB short
  CHECK(err(oom) == kOom);
  CHECK(oom.error().bytes_short == 2 * kMiB);
  CHECK(err(b.device_free(p1 + 16)) == kInvArg);
  CHECK(err(b.device_free(0)) == kInvArg);
  CHECK(same_usage(b.usage(), u));
  REQUIRE(b.device_free(p2).ok());
  CHECK(err(b.device_free(p2)) == kInvArg);
  usage_is(b, 4 * kMiB, 0, 4 * kMiB);
  REQUIRE((b.device_free(p1).ok() && b.device_free(p3).ok()));
  CHECK(same_usage(b.usage(), Usage{}));
  invariants(b);
}

// Captures on `st` allocations of page-rounded sizes 4, 2, 6 MiB with frees in between:
// live pages 4, 6, 2, 8, 6, 0 -> peak 8 MiB. Six nodes.
GraphHandle capture_peak8(SimBackend& b, StreamId st) {
  REQUIRE(b.begin_capture(st).ok());
  // Arena (chunk = one page here): a takes a 6 MiB chunk, c a 2 MiB one; d (4 MiB) fits in
  // a's freed 6 MiB, so the arena stays at 8 MiB.
  const DevPtr a = *b.malloc_async(5 * kMiB, st);
  const DevPtr c = *b.malloc_async(1 * kMiB, st);
  REQUIRE(b.free_async(a, st).ok());
  const DevPtr d = *b.malloc_async(3 * kMiB, st);
  REQUIRE((b.free_async(c, st).ok() && b.free_async(d, st).ok()));
  return *b.end_capture(st);
}

// One allocation of `bytes` freed inside the graph: peak = bytes page-rounded; two nodes.
GraphHandle capture_temp(SimBackend& b, StreamId st, uint64_t bytes) {
  REQUIRE(b.begin_capture(st).ok());
  REQUIRE(b.free_async(*b.malloc_async(bytes, st), st).ok());
  return *b.end_capture(st);
}

TEST_CASE_METHOD(Sim, "graph memory: physical attached at launch, page-rounded peak",
                 "[sim_backend][graph]") {
  const StreamId st = *b.create_stream();
  const GraphHandle g = capture_peak8(b, st);
  // end_capture: 20 us + 6 nodes x (1 + 3) us; begin 5 us; the 6 captured malloc/free_async
  // calls are priced as nodes only.
  CHECK(b.time_in(P::kEndCapture) == 44000);
  CHECK(b.now() == 5000 + 44000);
  graph_is(b, 0, 0);
  // First launch: 2.5 us + 4 granules mapped x 4 us; its 6 nodes are all memory nodes, so
  // nothing is uploaded per node.
  expect_cost(b, P::kLaunch, 18500, [&] { REQUIRE(b.launch(g, st).ok()); });
  CHECK(b.last_call().nodes == 0);
  CHECK(b.last_call().bytes == 8 * kMiB);
  graph_is(b, 8 * kMiB, 0);
  CHECK(metrics.peak("graph_mem_reserved") == 8.0 * kMiB);
  // Relaunch: no mapping cost, no growth.
  expect_cost(b, P::kLaunch, 2500, [&] { REQUIRE(b.launch(g, st).ok()); });
  CHECK(b.last_call().bytes == 0);
  graph_is(b, 8 * kMiB, 0);
}

TEST_CASE_METHOD(Sim,
                 "graph memory: graphs share one pool; an idle stream shares it, a busy one not",
                 "[sim_backend][graph]") {
  const StreamId s1 = *b.create_stream(), s2 = *b.create_stream();
  const GraphHandle g1 = capture_peak8(b, s1);
  const GraphHandle g2 = capture_temp(b, s1, 5 * kMiB);   // peak 6 MiB
  const GraphHandle g3 = capture_temp(b, s1, 11 * kMiB);  // peak 12 MiB
  REQUIRE((b.launch(g1, s1).ok() && b.launch(g2, s1).ok()));
  graph_is(b, 8 * kMiB, 0);  // max(8, 6), not 14
  REQUIRE((b.launch(g3, s1).ok() && b.launch(g1, s1).ok()));
  graph_is(b, 12 * kMiB, 0);  // max(8, 6, 12)
  // Once the device is idle, g2 moves to s2 and keeps sharing: no remap (H200: 11.3 against
  // 10.7 us, tools/repro/graph_node_semantics.cu).
  REQUIRE(b.synchronize().ok());
  expect_cost(b, P::kLaunch, 2500, [&] { REQUIRE(b.launch(g2, s2).ok()); });
  graph_is(b, 12 * kMiB, 0);
  // g1 on s1 while g2 may still run on s2: they cannot share, 8 + 6 MiB; g1's pages are taken,
  // so it is remapped (4 granules at 8 us).
  expect_cost(b, P::kLaunch, 2500 + 4 * 8000, [&] { REQUIRE(b.launch(g1, s1).ok()); });
  graph_is(b, 14 * kMiB, 0);
  // g3 (12 MiB) beside g2: 18 MiB, remapped (6 granules).
  expect_cost(b, P::kLaunch, 2500 + 6 * 8000, [&] { REQUIRE(b.launch(g3, s1).ok()); });
  graph_is(b, 18 * kMiB, 0);
  // Waiting on s2's work by an event does not let g1 share g2's pages (the driver looks at
  // whether g2 still runs); after a synchronize() it does, and the pool keeps its 18 MiB.
  REQUIRE(b.stream_wait(s1, s2).ok());
  expect_cost(b, P::kLaunch, 2500, [&] { REQUIRE(b.launch(g1, s1).ok()); });
  graph_is(b, 18 * kMiB, 0);
  REQUIRE(b.synchronize().ok());
  expect_cost(b, P::kLaunch, 2500, [&] { REQUIRE(b.launch(g3, s1).ok()); });
  graph_is(b, 18 * kMiB, 0);

  SECTION("trim drops the reservation to what is live; the next launch maps again") {
    REQUIRE(b.graph_mem_trim().ok());
    graph_is(b, 0, 0);
    expect_cost(b, P::kLaunch, 2500 + 3 * 4000, [&] { REQUIRE(b.launch(g2, s1).ok()); });
    graph_is(b, 6 * kMiB, 0);
  }
}

TEST_CASE_METHOD(Sim, "graph memory: new chunks fit the request; adjacent free chunks merge",
                 "[sim_backend][graph]") {
  // As the driver does (memsim-graphmem-probe on H200): a request that fits no free range gets
  // a new chunk sized for all of it (not just the shortfall past a free tail); free space of
  // adjacent chunks merges.
  const StreamId st = *b.create_stream();
  REQUIRE(b.begin_capture(st).ok());
  const DevPtr a = *b.malloc_async(3 * kMiB, st);  // 4 MiB chunk
  REQUIRE(b.free_async(a, st).ok());
  const DevPtr d = *b.malloc_async(5 * kMiB, st);  // 6 MiB: a new chunk (10 MiB in all)
  REQUIRE(b.free_async(d, st).ok());
  const DevPtr e = *b.malloc_async(7 * kMiB, st);  // 8 MiB fits the merged 10 MiB
  REQUIRE(b.free_async(e, st).ok());
  const GraphHandle g = *b.end_capture(st);
  REQUIRE(b.launch(g, st).ok());
  graph_is(b, 10 * kMiB, 0);
}

TEST_CASE_METHOD(Sim, "graph memory: launch growth beyond capacity is a reportable OOM",
                 "[sim_backend][graph]") {
  const StreamId st = *b.create_stream();
  const GraphHandle g = capture_peak8(b, st);
  const PhysHandle h = *b.create_physical(60 * kMiB, "hog");
  const Usage before = b.usage();
  auto r = b.launch(g, st);
  CHECK(err(r) == kOom);
  CHECK(r.error().bytes_short == 4 * kMiB);
  CHECK(same_usage(b.usage(), before));
  REQUIRE((b.release_physical(h).ok() && b.launch(g, st).ok()));
  graph_is(b, 8 * kMiB, 0);
}

TEST_CASE_METHOD(Sim, "graph memory: outputs stay live, freed outside or by another graph",
                 "[sim_backend][graph]") {
  const StreamId st = *b.create_stream();
  REQUIRE(b.begin_capture(st).ok());
  const DevPtr out = *b.malloc_async(3 * kMiB, st);  // 4 MiB output
  const DevPtr tmp = *b.malloc_async(2 * kMiB, st);
  REQUIRE((b.fill(out, 3 * kMiB, 0, st).ok() && b.free_async(tmp, st).ok()));
  const GraphHandle g = *b.end_capture(st);
  graph_is(b, 0, 0);
  REQUIRE(b.launch(g, st).ok());
  graph_is(b, 6 * kMiB, 4 * kMiB);
  REQUIRE(b.launch(g, st).ok());  // relaunch auto-frees and re-allocates the output
  graph_is(b, 6 * kMiB, 4 * kMiB);

  SECTION("free_async outside capture frees the output") {
    REQUIRE(b.free_async(out, st).ok());
    graph_is(b, 6 * kMiB, 0);
    CHECK(err(b.free_async(out, st)) == kInvState);
    REQUIRE(b.launch(g, st).ok());  // the next launch allocates it again
    graph_is(b, 6 * kMiB, 4 * kMiB);
  }
  SECTION("a free node in a second graph frees the output when that graph launches") {
    const StreamId st2 = *b.create_stream();
    REQUIRE((b.begin_capture(st2).ok() && b.free_async(out, st2).ok()));
    const GraphHandle g2 = *b.end_capture(st2);
    CHECK(b.usage().graph_mem_used == 4 * kMiB);  // capturing the free frees nothing
    REQUIRE(b.launch(g2, st2).ok());
    CHECK(b.usage().graph_mem_used == 0);
    invariants(b);
  }
  SECTION("trim keeps live outputs; trimming after their free releases everything") {
    REQUIRE(b.graph_mem_trim().ok());
    graph_is(b, 4 * kMiB, 4 * kMiB);
    REQUIRE((b.free_async(out, st).ok() && b.graph_mem_trim().ok()));
    graph_is(b, 0, 0);
    CHECK(b.usage().per_tag.empty());
    invariants(b);
  }
  SECTION("destroy keeps the graph's addresses while an output is live") {
    // out at 0 (3 MiB), tmp after it (2 MiB): a 5 MiB window, 6 MiB of VA.
    CHECK(tmp == out + 3 * kMiB);
    const uint64_t mapped = b.usage().virtual_mapped;
    REQUIRE(b.destroy_graph(g).ok());
    CHECK(b.usage().virtual_mapped == mapped);
    graph_is(b, 6 * kMiB, 4 * kMiB);
    REQUIRE(b.free_async(out, st).ok());
    CHECK(b.usage().virtual_mapped == mapped - 6 * kMiB);
    graph_is(b, 6 * kMiB, 0);
  }
}

// A graph's live outputs are inside its stream's backing (its peak includes them), and any other
// graph's launch also adds "live outputs of other graphs": the same bytes count twice.
TEST_CASE_METHOD(Sim, "graph memory: a graph without allocations does not grow the pool",
                 "[sim_backend][graph][bug]") {
  const StreamId st = *b.create_stream();
  REQUIRE(b.begin_capture(st).ok());
  const DevPtr out = *b.malloc_async(3 * kMiB, st);  // 4 MiB output
  REQUIRE(b.free_async(*b.malloc_async(kG, st), st).ok());
  const GraphHandle g = *b.end_capture(st);
  REQUIRE((b.begin_capture(st).ok() && b.fill(out, kG, 0, st).ok()));  // no memory nodes
  const GraphHandle no_mem = *b.end_capture(st);
  REQUIRE(b.launch(g, st).ok());
  graph_is(b, 6 * kMiB, 4 * kMiB);
  REQUIRE(b.launch(no_mem, st).ok());
  graph_is(b, 6 * kMiB, 4 * kMiB);  // is 10 MiB
}

TEST_CASE_METHOD(Sim, "destroy_graph releases its VA", "[sim_backend][graph]") {
  const StreamId st = *b.create_stream();
  REQUIRE(b.begin_capture(st).ok());
  const DevPtr p = *b.malloc_async(3 * kMiB, st);
  REQUIRE(b.free_async(p, st).ok());
  const GraphHandle g = *b.end_capture(st);
  REQUIRE((b.launch(g, st).ok() && b.destroy_graph(g).ok()));
  CHECK(b.usage().virtual_mapped == 0);
  CHECK(err(b.destroy_graph(g)) == kInvArg);
  CHECK(err(b.launch(g, st)) == kInvArg);
  CHECK(*b.device_malloc(4 * kMiB, "again") == p);  // first fit hands the address out again
  invariants(b);
}

TEST_CASE_METHOD(Sim, "capture misuse returns error values and changes nothing",
                 "[sim_backend][graph]") {
  const StreamId st = *b.create_stream();
  CHECK(err(b.end_capture(st)) == kInvState);
  CHECK(err(b.launch(GraphHandle{77}, st)) == kInvArg);
  REQUIRE(b.begin_capture(st).ok());
  CHECK(err(b.begin_capture(st)) == kInvState);
  const DevPtr p = *b.malloc_async(kG, st);
  CHECK(err(b.free_async(0x1234000, st)) == kInvArg);
  REQUIRE(b.free_async(p, st).ok());
  CHECK(err(b.free_async(p, st)) == kInvArg);  // double free inside the capture
  const GraphHandle g = *b.end_capture(st);
  CHECK(err(b.end_capture(st)) == kInvState);
  REQUIRE(b.begin_capture(st).ok());
  CHECK(err(b.launch(g, st)) == kInvState);  // into a capturing stream
  REQUIRE((b.end_capture(st).ok() && b.destroy_graph(g).ok()));
  const Usage before = b.usage();
  CHECK(err(b.launch(g, st)) == kInvArg);
  CHECK(err(b.free_async(p, st)) == kInvArg);
  CHECK(same_usage(b.usage(), before));
  CHECK(b.usage().physical_bytes == 0);
  invariants(b);
}

TEST_CASE_METHOD(Sim, "every primitive advances now() by exactly its priced cost",
                 "[sim_backend][time]") {
  PhysHandle h{};
  DevPtr va = 0, d = 0, a = 0, pin = 0;
  GraphHandle g{};
  const StreamId st = *b.create_stream();
  CHECK(b.now() == 0);  // create_stream is free
  expect_cost(b, P::kCreatePhysical, 11000, [&] { h = *b.create_physical(4 * kMiB, "t"); });
  expect_cost(b, P::kReserveVirtual, 20000, [&] { va = *b.reserve_virtual(8 * kMiB, 0); });
  expect_cost(b, P::kMap, 1500, [&] { REQUIRE(b.map(va, 4 * kMiB, h, 0).ok()); });
  expect_cost(b, P::kSetAccess, 32500, [&] { REQUIRE(b.set_access(va, 4 * kMiB).ok()); });
  expect_cost(b, P::kUnmap, 17000, [&] { REQUIRE(b.unmap(va, 4 * kMiB).ok()); });
  expect_cost(b, P::kReleasePhysical, 4000, [&] { REQUIRE(b.release_physical(h).ok()); });
  expect_cost(b, P::kFreeVirtual, 8000, [&] { REQUIRE(b.free_virtual(va).ok()); });
  expect_cost(b, P::kDeviceMalloc, 41000, [&] { d = *b.device_malloc(3 * kMiB, "t"); });
  expect_cost(b, P::kMallocAsync, 1000, [&] { a = *b.malloc_async(3 * kMiB, st); });
  expect_cost(b, P::kFill, 4000, [&] { REQUIRE(b.fill(d, 2 * kMiB, 7, st).ok()); });
  expect_cost(b, P::kCopy, 6000, [&] { REQUIRE(b.copy(d, a, 2 * kMiB, st).ok()); });
  expect_cost(b, P::kFreeAsync, 1000, [&] { REQUIRE(b.free_async(a, st).ok()); });
  expect_cost(b, P::kDeviceFree, 30000, [&] { REQUIRE(b.device_free(d).ok()); });
  expect_cost(b, P::kHostMallocPinned, 54000, [&] { pin = *b.host_malloc_pinned(4096); });
  CHECK(b.usage().pinned_host_bytes == 4096);
  expect_cost(b, P::kHostFreePinned, 30000, [&] { REQUIRE(b.host_free_pinned(pin).ok()); });
  expect_cost(b, P::kBeginCapture, 5000, [&] { REQUIRE(b.begin_capture(st).ok()); });
  // Captured work is priced per node at end_capture and launch only (not per call or byte).
  expect_cost(b, P::kFill, 0, [&] { REQUIRE(b.fill(0x1000, 2 * kMiB, 0, st).ok()); });
  CHECK(!b.last_call().priced);
  expect_cost(b, P::kEndCapture, 24000, [&] { g = *b.end_capture(st); });
  CHECK(b.last_call().nodes == 1);
  // First launch uploads the node (0.5 us); a replay costs the per-call term only.
  expect_cost(b, P::kLaunch, 3000, [&] { REQUIRE(b.launch(g, st).ok()); });
  CHECK(b.last_call().p == P::kLaunch);
  CHECK(b.last_call().nodes == 1);
  expect_cost(b, P::kLaunch, 2500, [&] { REQUIRE(b.launch(g, st).ok()); });
  CHECK(b.last_call().nodes == 0);
  expect_cost(b, P::kDestroyGraph, 10000, [&] { REQUIRE(b.destroy_graph(g).ok()); });
  expect_cost(b, P::kGraphMemTrim, 50000, [&] { REQUIRE(b.graph_mem_trim().ok()); });
  // Failed calls are charged too (3 MiB = 2 granules).
  expect_cost(b, P::kCreatePhysical, 11000,
              [&] { CHECK(err(b.create_physical(3 * kMiB, "t")) == kInvArg); });

  SimTime total = 0;
  uint64_t calls = 0;
  for (size_t i = 0; i < static_cast<size_t>(P::kCount); ++i) {
    total += b.time_in(static_cast<P>(i));
    calls += b.calls_of(static_cast<P>(i));
  }
  CHECK(total == b.now());
  CHECK(calls == 23);
  CHECK(b.calls_of(P::kFill) == 2);
  CHECK(b.time_in(P::kFill) == 4000);
  CHECK(same_usage(b.usage(), Usage{}));
  invariants(b);
}

TEST_CASE("graph launch map time is rounded like GpuSpec::price", "[sim_backend][time][bug]") {
  GpuSpec gpu = test_gpu();
  gpu.graph_mem_map_per_granule_us = 3.9;  // the H200 figure
  gpu.upload_per_node_us = 0;
  Sim s({}, gpu);
  const StreamId st = *s.b.create_stream();
  const GraphHandle g = capture_temp(s.b, st, 26 * kMiB);  // 13 granules x 3.9 us = 50.7 us
  expect_cost(s.b, P::kLaunch, 2500 + 50700, [&] { REQUIRE(s.b.launch(g, st).ok()); });
}

// A shadow model of handles, reservations, mappings and device allocations: it predicts the
// outcome of every call (valid or not) of the randomized workload below.
struct VmmShadow {
  struct Handle {
    uint64_t bytes;
    uint32_t maps = 0;
    bool released = false;
  };
  struct Mapping {
    uint64_t bytes, handle;
  };
  using Maps = std::map<uint64_t, Mapping>;  // offset in the reservation -> mapping
  explicit VmmShadow(SimBackend& backend) : b(backend) {}
  SimBackend& b;
  std::mt19937_64 rng{20240611};
  std::map<uint64_t, Handle> hs;
  std::map<DevPtr, std::pair<uint64_t, Maps>> rs;  // base -> (size, mappings)
  std::map<DevPtr, uint64_t> dev;
  uint64_t phys = 0, reserved = 0, mapped = 0;
  bool want = false, got = false;  // the last op's predicted and actual success

  template <class M>
  auto pick(M& m) {
    return std::next(m.begin(), static_cast<long>(rng() % m.size()));
  }
  static bool overlaps(const Maps& maps, uint64_t off, uint64_t bytes) {
    for (const auto& [o, m] : maps)
      if (o < off + bytes && off < o + m.bytes) return true;
    return false;
  }
  void drop_map(Maps& maps, Maps::iterator it) {
    Handle& h = hs.at(it->second.handle);
    --h.maps;
    mapped -= it->second.bytes;
    if (h.released && h.maps == 0) phys -= h.bytes, hs.erase(it->second.handle);
    maps.erase(it);
  }
  // One random call of `kind` (0..7): false when there was nothing to call it on.
  bool op(int kind) {
    want = got = false;
    if (kind == 0) {  // create_physical, sometimes of an invalid size
      const uint64_t k = rng() % 10;
      const uint64_t bytes = k < 8 ? (k + 1) * kG : (k == 8 ? 0 : kG + kMiB);
      want = k < 8 && phys + bytes <= kCap;
      auto r = b.create_physical(bytes, k % 2 ? "odd" : "even");
      got = r.ok();
      if (got && want) hs.emplace(r->id, Handle{bytes}), phys += bytes;
      if (!got && k < 8) REQUIRE(r.error().bytes_short == phys + bytes - kCap);
    } else if (kind == 1) {  // release_physical of a live, released or unknown handle
      const uint64_t id = !hs.empty() && rng() % 4 ? pick(hs)->first : 1000000 + rng() % 9;
      auto it = hs.find(id);
      want = it != hs.end() && !it->second.released;
      got = b.release_physical(PhysHandle{id}).ok();
      if (got && want && it->second.maps > 0) it->second.released = true;
      if (got && want && it->second.maps == 0) phys -= it->second.bytes, hs.erase(it);
    } else if (kind == 2) {  // reserve_virtual, sometimes of an invalid size
      if (rs.size() >= 40) return false;
      const uint64_t bytes = rng() % 8 ? (1 + rng() % 16) * kG : kG / 2;
      want = bytes % kG == 0;
      auto r = b.reserve_virtual(bytes, rng() % 2 ? 0 : 8 * kG);
      got = r.ok();
      if (got && want) rs.emplace(*r, std::pair{bytes, Maps{}}), reserved += bytes;
    } else if (kind == 3) {  // free_virtual of a reservation (maybe mapped) or a bogus address
      if (rs.empty()) return false;
      auto it = pick(rs);
      const bool bogus = rng() % 5 == 0;
      want = !bogus && it->second.second.empty();
      got = b.free_virtual(it->first + (bogus ? 1 : 0)).ok();
      if (got && want) reserved -= it->second.first, rs.erase(it);
    } else if (kind == 4) {  // map with random alignment, handle, range and overlap errors
      if (rs.empty() || hs.empty()) return false;
      auto hit = pick(hs);
      auto rit = pick(rs);  // the range may run past its end, even into the next reservation
      const uint64_t skew = rng() % 10 == 0 ? kMiB : 0;
      const DevPtr va = rit->first + kG * (rng() % (rit->second.first / kG + 1)) + skew;
      const uint64_t bytes = kG * (1 + rng() % 4) + (rng() % 10 == 0 ? kMiB : 0);
      const uint64_t hoff = kG * (rng() % 3);
      rit = std::prev(rs.upper_bound(va));  // va >= the smallest base
      const uint64_t off = va - rit->first;
      want = skew == 0 && bytes % kG == 0 && !hit->second.released &&
             hoff + bytes <= hit->second.bytes && off + bytes <= rit->second.first &&
             !overlaps(rit->second.second, off, bytes) && hoff == 0 &&
             bytes == hit->second.bytes;  // cuMemMap: whole handles only
      got = b.map(va, bytes, PhysHandle{hit->first}, hoff).ok();
      if (got && want) {
        rit->second.second.emplace(off, Mapping{bytes, hit->first});
        ++hit->second.maps;
        mapped += bytes;
        auto res = b.resolve(va + bytes - 1);
        REQUIRE(res.has_value());
        REQUIRE(res->handle == PhysHandle{hit->first});
        REQUIRE(res->offset == hoff + bytes - 1);
      }
    } else if (kind == 5) {  // unmap one whole mapping, or a random (rarely exact) range
      if (rs.empty()) return false;
      auto rit = pick(rs);
      Maps& maps = rit->second.second;
      uint64_t off = kG * (rng() % (rit->second.first / kG)), bytes = kG * (1 + rng() % 3);
      if (!maps.empty() && rng() % 2) {
        auto m = pick(maps);
        off = m->first, bytes = m->second.bytes;
      }
      std::vector<Maps::iterator> victims;
      uint64_t cur = off;
      bool exact = off + bytes <= rit->second.first;
      for (auto it = maps.lower_bound(off); exact && it != maps.end() && it->first < off + bytes;
           ++it) {
        exact = it->first == cur && it->first + it->second.bytes <= off + bytes;
        cur += it->second.bytes;
        victims.push_back(it);
      }
      want = exact && cur == off + bytes;
      got = b.unmap(rit->first + off, bytes).ok();
      if (got && want)
        for (auto it : victims) drop_map(maps, it);
    } else if (kind == 6) {  // device_malloc of a random size (0 is invalid)
      const uint64_t bytes = rng() % 20 ? 1 + rng() % (8 * kMiB) : 0;
      const uint64_t acc = (bytes + kG - 1) / kG * kG;
      want = bytes > 0 && phys + acc <= kCap;
      auto r = b.device_malloc(bytes, "dev");
      got = r.ok();
      if (got && want) dev.emplace(*r, acc), phys += acc, mapped += acc;
    } else {  // device_free of a live or bogus pointer
      if (dev.empty()) return false;
      auto it = pick(dev);
      want = rng() % 5 != 0;
      got = b.device_free(it->first + (want ? 0 : 4096)).ok();
      if (got && want) phys -= it->second, mapped -= it->second, dev.erase(it);
    }
    return true;
  }
};

TEST_CASE_METHOD(Sim, "randomized VMM and device_malloc workload keeps exact accounting",
                 "[sim_backend][random]") {
  VmmShadow m(b);
  int oks = 0;
  for (int op = 0; op < 50000; ++op) {
    const Usage before = b.usage();
    const int kind = static_cast<int>(m.rng() % 8);
    if (!m.op(kind)) continue;
    INFO("op " << op << " kind " << kind);
    REQUIRE(m.got == m.want);
    oks += m.got;
    const Usage u = b.usage();
    if (!m.got) REQUIRE(same_usage(u, before));
    REQUIRE(u.physical_bytes == m.phys);
    REQUIRE(u.virtual_reserved == m.reserved);
    REQUIRE(u.virtual_mapped == m.mapped);
    REQUIRE(u.physical_bytes <= kCap);
    if (op % 100 == 0) REQUIRE(invariants(b));
  }
  CHECK(oks > 10000);
  // Tear down everything the shadow says is live.
  for (auto& [va, r] : m.rs) {
    VmmShadow::Maps& maps = r.second;
    while (!maps.empty()) {
      REQUIRE(b.unmap(va + maps.begin()->first, maps.begin()->second.bytes).ok());
      m.drop_map(maps, maps.begin());
    }
    REQUIRE(b.free_virtual(va).ok());
  }
  for (auto& [id, h] : m.hs) REQUIRE(b.release_physical(PhysHandle{id}).ok());
  for (auto& [p, acc] : m.dev) REQUIRE(b.device_free(p).ok());
  CHECK(same_usage(b.usage(), Usage{}));
  CHECK(invariants(b));
}

}  // namespace
}  // namespace memsim
