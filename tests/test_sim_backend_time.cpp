// Exact-number tests of SimBackend call pricing that depends on the driver's state: live VA
// mappings (and the knee of that term) and the first call of a primitive after a graph launch.
#include <catch2/catch.hpp>

#include "backends/sim/sim_backend.h"
#include "tests/sim_backend_test_util.h"

namespace memsim {
namespace {

using namespace test;  // NOLINT(google-build-using-namespace)

TEST_CASE("calls are priced per VA mapping live when they are made", "[sim_backend][time]") {
  GpuSpec gpu = test_gpu();
  gpu.cost(P::kMap).per_log2_mappings_us = 0.5;
  gpu.cost(P::kReserveVirtual).per_log2_mappings_us = 2;
  Sim s({}, gpu);
  SimBackend& b = s.b;
  const DevPtr va = *b.reserve_virtual(4 * kG, kG);
  CHECK(b.last_call().mappings == 0);
  const PhysHandle h0 = *b.create_physical(kG, "t"), h1 = *b.create_physical(kG, "t");
  // map: 1 us + 0.25 per handle + 0.125 per granule, + 0.5 us x log2(1 + mappings live).
  expect_cost(b, P::kMap, 1375, [&] { REQUIRE(b.map(va, kG, h0, 0).ok()); });
  expect_cost(b, P::kReserveVirtual, 22000, [&] { (void)*b.reserve_virtual(kG, kG); });
  CHECK(b.last_call().mappings == 1);
  expect_cost(b, P::kMap, 1875, [&] { REQUIRE(b.map(va + kG, kG, h1, 0).ok()); });
  CHECK(b.last_call().mappings == 1);
  const PhysHandle third = *b.create_physical(kG, "t");
  expect_cost(b, P::kMap, 2167, [&] { REQUIRE(b.map(va + 2 * kG, kG, third, 0).ok()); });
  CHECK(b.last_call().mappings == 2);  // 1.375 + 0.5 x log2(3) = 2.1675 us
  REQUIRE(b.unmap(va, 3 * kG).ok());   // every mapping ends
  expect_cost(b, P::kReserveVirtual, 20000, [&] { (void)*b.reserve_virtual(kG, kG); });
  CHECK(b.last_call().mappings == 0);
}

TEST_CASE("the first call of a primitive since a graph launch pays first_after_launch",
          "[sim_backend][time]") {
  GpuSpec gpu = test_gpu();
  gpu.cost(P::kDeviceMalloc).first_after_launch_us = 60;
  gpu.cost(P::kFill).first_after_launch_us = 7;
  gpu.cost(P::kLaunch).first_after_launch_us = 1000;  // a launch is never a first
  Sim s({}, gpu);
  SimBackend& b = s.b;
  const StreamId st = *b.create_stream();
  // device_malloc: 40 us + 0.5 per granule (one granule here), + 60 us when first.
  expect_cost(b, P::kDeviceMalloc, 100500, [&] { (void)*b.device_malloc(kG, "t"); });
  CHECK(b.last_call().first_after_launch);
  expect_cost(b, P::kDeviceMalloc, 40500, [&] { (void)*b.device_malloc(kG, "t"); });
  CHECK_FALSE(b.last_call().first_after_launch);
  // A fill captured into the graph is a node: neither priced nor warming the fill path.
  const DevPtr buf = *b.device_malloc(kG, "t");
  REQUIRE(b.begin_capture(st).ok());
  REQUIRE(b.fill(buf, 1024, 0, st).ok());
  CHECK_FALSE(b.last_call().priced);
  CHECK_FALSE(b.last_call().first_after_launch);
  const GraphHandle g = *b.end_capture(st);
  // The first launch uploads the graph's one node (0.5 us).
  expect_cost(b, P::kLaunch, 3000, [&] { REQUIRE(b.launch(g, st).ok()); });
  CHECK_FALSE(b.last_call().first_after_launch);
  // After the launch every primitive runs cold once: the malloc, and the first eager fill.
  expect_cost(b, P::kDeviceMalloc, 100500, [&] { (void)*b.device_malloc(kG, "t"); });
  expect_cost(b, P::kDeviceMalloc, 40500, [&] { (void)*b.device_malloc(kG, "t"); });
  expect_cost(b, P::kFill, 9001, [&] { REQUIRE(b.fill(buf, 1024, 0, st).ok()); });
  expect_cost(b, P::kFill, 2001, [&] { REQUIRE(b.fill(buf, 1024, 0, st).ok()); });
  expect_cost(b, P::kLaunch, 2500, [&] { REQUIRE(b.launch(g, st).ok()); });
  expect_cost(b, P::kDeviceMalloc, 100500, [&] { (void)*b.device_malloc(kG, "t"); });
}

TEST_CASE("the mappings term bends at va_mappings_knee", "[sim_backend][time]") {
  GpuSpec gpu = test_gpu();
  gpu.cost(P::kReserveVirtual).per_log2_mappings_us = 2;
  gpu.va_mappings_knee = 2;
  CHECK(gpu.mappings_feature(0) == 0);
  CHECK(gpu.mappings_feature(2) == 1);  // log2(1 + 2 / 2)
  CHECK(gpu.mappings_feature(6) == 2);
  // reserve_virtual: 20 us + 2 us x log2(1 + 6 / 2).
  CHECK(gpu.price(P::kReserveVirtual, 0, 0, 6) == 24000);
  CHECK(gpu.price(P::kReserveVirtual, 0, 0, 6, true) == 24000);  // no first-after-launch term
  gpu.cost(P::kReserveVirtual).first_after_launch_us = 3.5;
  CHECK(gpu.price(P::kReserveVirtual, 0, 0, 6, true) == 27500);
}

}  // namespace
}  // namespace memsim
