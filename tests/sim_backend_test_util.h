// Test helpers for SimBackend: a small GPU whose every price is a binary fraction of a
// microsecond (exact in nanoseconds), a backend bundle, and an exact-cost check.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "core/metrics.h"

namespace memsim::test {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kG = 2 * kMiB;  // granularity
constexpr uint64_t kCap = 64 * kMiB;
using P = Primitive;

inline GpuSpec test_gpu() {
  GpuSpec g;
  g.name = "test";
  g.capacity = kCap;
  g.granularity = kG;
  g.va_space = 1ull << 40;
  g.capture_per_node_us = 1;
  g.instantiate_per_node_us = 3;
  g.upload_per_node_us = 0.5;
  g.graph_mem_map_per_granule_us = 4;
  g.graph_mem_remap_per_granule_us = 8;
  // clang-format off
  const std::pair<P, CostTerm> costs[] = {  // {per_call, per_handle, per_granule, bytes_per_us}
      {P::kCreatePhysical, {10, 0, 0.5}}, {P::kReleasePhysical, {4}}, {P::kReserveVirtual, {20}},
      {P::kFreeVirtual, {8}}, {P::kMap, {1, 0.25, 0.125}}, {P::kUnmap, {0, 16, 0.5}},
      {P::kSetAccess, {0, 32, 0.25}}, {P::kDeviceMalloc, {40, 0, 0.5}}, {P::kDeviceFree, {30}},
      {P::kMallocAsync, {1}}, {P::kFreeAsync, {1}}, {P::kHostMallocPinned, {50, 0, 0, 1024}},
      {P::kHostFreePinned, {30}}, {P::kFill, {2, 0, 0, 1 << 20}}, {P::kCopy, {2, 0, 0, 1 << 20}},
      {P::kBeginCapture, {5}}, {P::kEndCapture, {20}}, {P::kLaunch, {2.5}},
      {P::kDestroyGraph, {10}}, {P::kGraphMemTrim, {50}}, {P::kUpload, {2.5}},
      {P::kStreamWait, {2}}, {P::kSynchronize, {4}}};
  // clang-format on
  for (const auto& [p, c] : costs) g.cost(p) = c;
  return g;
}

struct Sim {
  explicit Sim(std::vector<FaultInjection> faults = {}, GpuSpec gpu = test_gpu())
      : b(std::move(gpu), clock, &metrics, std::move(faults)) {}
  SimClock clock;
  MetricsRecorder metrics{clock};
  SimBackend b;
};

// Runs `fn` and checks that it advanced now() and time_in(p) by exactly `ns`, and calls_of(p) by 1.
template <class F>
void expect_cost(SimBackend& b, P p, SimTime ns, F&& fn) {
  const SimTime t0 = b.now(), p0 = b.time_in(p);
  const uint64_t c0 = b.calls_of(p);
  fn();
  INFO("primitive " << to_string(p));
  CHECK(b.now() - t0 == ns);
  CHECK(b.time_in(p) - p0 == ns);
  CHECK(b.calls_of(p) == c0 + 1);
}

}  // namespace memsim::test
