// CudaBackend on a real GPU: aliasing, remapping, sim-identical misuse errors, graph memory,
// teardown, timing and fault passthrough; exits 77 (skipped) when no CUDA device is present.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "kernels/fill.h"
#include "src/drivers/capture_runner.h"
#include "src/graph/registry.h"
#include "tests/cuda_test_util.h"
#include "tests/tiny_model.h"

namespace memsim {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr StreamId kS0{0};
using P = Primitive;

// Cost model of the shadow; capacity and granularity are replaced by the device's.
GpuSpec test_gpu() {
  GpuSpec g;
  g.name = "test";
  g.capacity = 1ull << 30;
  g.granularity = 2 * kMiB;
  g.va_space = 1ull << 44;
  g.capture_per_node_us = 1;
  g.instantiate_per_node_us = 3;
  g.upload_per_node_us = 0.5;
  g.graph_mem_map_per_granule_us = 4;
  g.graph_mem_remap_per_granule_us = 4;
  for (size_t i = 0; i < static_cast<size_t>(P::kCount); ++i) g.costs[i] = CostTerm{10, 1, 0.5};
  g.cost(P::kFill).bytes_per_us = 3e6;
  g.cost(P::kCopy).bytes_per_us = 3e6;
  return g;
}

struct Gpu {
  explicit Gpu(bool sync_for_timing = false, std::vector<FaultInjection> faults = {})
      : b(take(CudaBackend::create(test_gpu(), clock, &metrics, 0, sync_for_timing,
                                   std::move(faults)))) {}
  SimClock clock;
  MetricsRecorder metrics{clock};
  std::unique_ptr<CudaBackend> b;

  // A reservation of `bytes` with `h` mapped at `offset` and access set.
  DevPtr mapped(PhysHandle h, uint64_t bytes, uint64_t offset = 0) {
    const DevPtr va = take(b->reserve_virtual(bytes, 0));
    ok(b->map(va, bytes, h, offset));
    ok(b->set_access(va, bytes));
    return va;
  }
  uint64_t mismatches(DevPtr p, uint64_t bytes, uint32_t pattern, StreamId s = kS0) {
    return take(b->count_mismatches(p, bytes, pattern, s));
  }
};

TEST_CASE("device granularity and capacity replace the cost model's") {
  Gpu gpu;
  const uint64_t g = gpu.b->granularity();
  CHECK(g >= 2 * kMiB);
  CHECK(g % (2 * kMiB) == 0);
  const auto obs = take(gpu.b->observe());
  CHECK(gpu.b->capacity() == obs.total_bytes);
  CHECK(gpu.b->shadow().gpu().granularity == g);
  CHECK(obs.free_bytes <= obs.total_bytes);
  // The shadow's context term: what was not free at creation (the CUDA context at least), no
  // more than is not free now (the backend's stream and counter came after).
  CHECK(gpu.b->context() > 0);
  CHECK(gpu.b->context() <= obs.total_bytes - obs.free_bytes);
  CHECK(gpu.b->shadow().gpu().context == gpu.b->context());
}

TEST_CASE("one physical handle mapped at two VAs is coherent") {
  Gpu gpu;
  CudaBackend& b = *gpu.b;
  const uint64_t g = b.granularity();
  const PhysHandle h = take(b.create_physical(2 * g, "alias"));
  const DevPtr va1 = gpu.mapped(h, 2 * g);
  const DevPtr va2 = gpu.mapped(h, 2 * g);
  REQUIRE(va1 != va2);
  ok(b.fill(va1, 2 * g, 0x1234abcdu, kS0));
  CHECK(gpu.mismatches(va2, 2 * g, 0x1234abcdu) == 0);
  CHECK(gpu.mismatches(va2, 2 * g, 0x5555u) == 2 * g / 4);  // every word distinct
  // Writes through the second VA are seen through the first; a partial range shifts nothing.
  ok(b.fill(va2 + g, g, 0x77u, kS0));
  CHECK(gpu.mismatches(va1 + g, g, 0x77u) == 0);
  CHECK(gpu.mismatches(va1, g, 0x1234abcdu) == 0);
  // cuMemMap maps whole handles only: a partial mapping is refused by shadow and driver alike.
  const DevPtr va3 = take(b.reserve_virtual(2 * g, 0));
  CHECK(b.map(va3, g, h, 0).error().code == ErrorCode::kNotSupported);
  // A second handle mapped next to nothing else: writes through it leave h untouched.
  const PhysHandle h2 = take(b.create_physical(g, "other"));
  ok(b.map(va3, g, h2, 0));
  ok(b.set_access(va3, g));
  ok(b.fill(va3, g, 0x99u, kS0));
  CHECK(gpu.mismatches(va1, g, 0x1234abcdu) == 0);
  CHECK(gpu.mismatches(va3, g, 0x99u) == 0);
  const Usage u = b.usage();
  CHECK(u.physical_bytes == 3 * g);
  CHECK(u.virtual_mapped == 5 * g);
  CHECK(u.virtual_reserved == 6 * g);
}

TEST_CASE("unmap and remap keep the data; a new handle promises none") {
  Gpu gpu;
  CudaBackend& b = *gpu.b;
  const uint64_t g = b.granularity();
  const PhysHandle h = take(b.create_physical(g, "t"));
  const DevPtr va1 = gpu.mapped(h, g);
  const DevPtr va2 = gpu.mapped(h, g);
  ok(b.fill(va1, g, 0xfeedu, kS0));
  ok(b.unmap(va2, g));
  // The unmapped VA is refused before it reaches the GPU.
  CHECK(b.fill(va2, g, 1, kS0).error().code == ErrorCode::kInvalidArgument);
  CHECK(b.count_mismatches(va2, g, 1, kS0).error().code == ErrorCode::kInvalidArgument);
  const DevPtr va3 = gpu.mapped(h, g);
  CHECK(gpu.mismatches(va3, g, 0xfeedu) == 0);
  CHECK(gpu.mismatches(va1, g, 0xfeedu) == 0);
  // Mapped but without set_access: refused too.
  ok(b.map(va2, g, h, 0));
  CHECK(b.fill(va2, g, 1, kS0).error().code == ErrorCode::kInvalidArgument);
  ok(b.unmap(va2, g));
  // Release while mapped: memory lives until the last unmap (as in sim and the driver).
  ok(b.release_physical(h));
  CHECK(gpu.mismatches(va3, g, 0xfeedu) == 0);
  ok(b.unmap(va1, g));
  ok(b.unmap(va3, g));
  CHECK(b.usage().physical_bytes == 0);
  const PhysHandle h2 = take(b.create_physical(g, "t"));
  ok(b.map(va1, g, h2, 0));
  ok(b.set_access(va1, g));
  const uint64_t stale = gpu.mismatches(va1, g, 0xfeedu);
  INFO("words still holding the old pattern are not promised either way");
  CHECK(stale <= g / 4);
}

TEST_CASE("fill and copy work for any alignment, device, async and pinned memory") {
  Gpu gpu;
  CudaBackend& b = *gpu.b;
  const DevPtr a = take(b.device_malloc(8 * kMiB, "a"));
  const DevPtr c = take(b.malloc_async(8 * kMiB, kS0));
  const DevPtr host = take(b.host_malloc_pinned(8 * kMiB));
  ok(b.fill(a, 8 * kMiB, 0xabcu, kS0));
  ok(b.copy(c, a, 8 * kMiB, kS0));
  CHECK(gpu.mismatches(c, 8 * kMiB, 0xabcu) == 0);
  ok(b.copy(host, c, 8 * kMiB, kS0));
  ok(b.synchronize());
  const auto* words = reinterpret_cast<const uint32_t*>(host);
  CHECK(words[0] == fill_word(0xabcu, 0));
  CHECK(words[12345] == fill_word(0xabcu, 12345));
  CHECK(gpu.mismatches(host, 8 * kMiB, 0xabcu) == 0);
  // Unaligned start and a partial trailing word.
  ok(b.fill(a + 3, 4097, 0x31u, kS0));
  CHECK(gpu.mismatches(a + 3, 4097, 0x31u) == 0);
  CHECK(gpu.mismatches(a + 3, 4097, 0x32u) == 1025);
  ok(b.fill(a + 4, 4 * 1000 + 2, 0x41u, kS0));
  CHECK(gpu.mismatches(a + 4, 4 * 1000 + 2, 0x41u) == 0);
  // Out of range: refused, not a GPU fault.
  CHECK(b.fill(a + kMiB, 8 * kMiB, 1, kS0).error().code == ErrorCode::kInvalidArgument);
  CHECK(b.copy(c, a, 9 * kMiB, kS0).error().code == ErrorCode::kInvalidArgument);
  CHECK(b.fill(a, 16, 1, StreamId{99}).error().code == ErrorCode::kInvalidArgument);
  ok(b.free_async(c, kS0));
  ok(b.device_free(a));
  ok(b.host_free_pinned(host));
  CHECK(b.usage().physical_bytes == 0);
  CHECK(b.usage().pinned_host_bytes == 0);
}

TEST_CASE("misuse errors, accounting and simulated time are identical to the sim backend") {
  Gpu gpu;
  CudaBackend& b = *gpu.b;
  SimClock sim_clock;
  SimBackend sim(b.shadow().gpu(), sim_clock);
  const uint64_t g = b.granularity();
  // Each call is made once per backend, so call counts and time stay comparable.
  const auto same = [](const auto& x, const auto& y, ErrorCode expected) {
    REQUIRE(!x.ok());
    REQUIRE(!y.ok());
    CHECK(x.error().code == expected);
    CHECK(y.error().code == expected);
    CHECK(x.error().message == y.error().message);
  };
  constexpr ErrorCode kArg = ErrorCode::kInvalidArgument, kState = ErrorCode::kInvalidState;
  // Double release.
  const PhysHandle hb = take(b.create_physical(g, "x"));
  const PhysHandle hs = take(sim.create_physical(g, "x"));
  REQUIRE(hb == hs);
  ok(b.release_physical(hb));
  ok(sim.release_physical(hs));
  same(b.release_physical(hb), sim.release_physical(hs), kState);
  // Map over a mapping, map of a released handle, bad sizes.
  const PhysHandle h2b = take(b.create_physical(g, "y"));
  const PhysHandle h2s = take(sim.create_physical(g, "y"));
  const DevPtr vab = take(b.reserve_virtual(2 * g, 0));
  const DevPtr vas = take(sim.reserve_virtual(2 * g, 0));
  ok(b.map(vab, g, h2b, 0));
  ok(sim.map(vas, g, h2s, 0));
  same(b.map(vab, g, h2b, 0), sim.map(vas, g, h2s, 0), kState);
  same(b.map(vab + g, g, hb, 0), sim.map(vas + g, g, hs, 0), kArg);
  same(b.map(vab + g, g / 2, h2b, 0), sim.map(vas + g, g / 2, h2s, 0), kArg);
  same(b.create_physical(g + 1, "z"), sim.create_physical(g + 1, "z"), kArg);
  same(b.unmap(vab + g, g), sim.unmap(vas + g, g), kState);
  same(b.free_virtual(vab), sim.free_virtual(vas), kState);
  same(b.free_virtual(vab + g), sim.free_virtual(vas + g), kArg);
  same(b.set_access(vab, 2 * g), sim.set_access(vas, 2 * g), kState);
  same(b.end_capture(kS0), sim.end_capture(kS0), kState);
  same(b.launch(GraphHandle{42}, kS0), sim.launch(GraphHandle{42}, kS0), kArg);
  same(b.device_malloc(0, "w"), sim.device_malloc(0, "w"), kArg);
  same(b.device_free(vab), sim.device_free(vas), kArg);
  same(b.release_physical(PhysHandle{777}), sim.release_physical(PhysHandle{777}), kState);
  // Out of memory: the shadow refuses before the driver is asked.
  const uint64_t huge = (b.capacity() / g + 1) * g;
  const auto oom_b = b.create_physical(huge, "huge");
  const auto oom_s = sim.create_physical(huge, "huge");
  REQUIRE(!oom_b.ok());
  CHECK(oom_b.error().code == ErrorCode::kOutOfMemory);
  CHECK(oom_b.error().bytes_short == oom_s.error().bytes_short);
  CHECK(b.measured_calls_of(P::kCreatePhysical) == 2);  // the two that succeeded
  ok(b.unmap(vab, g));
  ok(sim.unmap(vas, g));
  const Usage ub = b.usage(), us = sim.usage();
  CHECK(ub.physical_bytes == us.physical_bytes);
  CHECK(ub.virtual_reserved == us.virtual_reserved);
  CHECK(ub.virtual_mapped == us.virtual_mapped);
  CHECK(ub.per_tag == us.per_tag);
  CHECK(b.now() == sim.now());
  for (size_t i = 0; i < static_cast<size_t>(P::kCount); ++i) {
    CHECK(b.calls_of(static_cast<P>(i)) == sim.calls_of(static_cast<P>(i)));
    CHECK(b.time_in(static_cast<P>(i)) == sim.time_in(static_cast<P>(i)));
  }
}

TEST_CASE("graph memory nodes of graphs in one stream share max, not sum") {
  Gpu gpu;
  CudaBackend& b = *gpu.b;
  const uint64_t g = b.granularity();
  ok(b.graph_mem_trim());
  const auto before = take(b.observe());
  const StreamId s = take(b.create_stream());
  const uint64_t sizes[] = {64 * kMiB, 256 * kMiB, 128 * kMiB};
  std::vector<GraphHandle> graphs;
  for (const uint64_t bytes : sizes) {
    ok(b.begin_capture(s));
    const DevPtr p = take(b.malloc_async(bytes, s));
    ok(b.fill(p, bytes, 0x600du, s));
    ok(b.free_async(p, s));
    graphs.push_back(take(b.end_capture(s)));
  }
  for (const GraphHandle gh : graphs) ok(b.launch(gh, s));
  ok(b.synchronize());
  const auto after = take(b.observe());
  const uint64_t reserved = after.graph_reserved_current - before.graph_reserved_current;
  const uint64_t max = 256 * kMiB, sum = 448 * kMiB;
  INFO("real graph memory reserved: " << reserved << " bytes, high " << after.graph_reserved_high);
  CHECK(reserved + g >= max);
  CHECK(reserved <= max + g);
  CHECK(reserved < sum);
  CHECK(b.usage().graph_mem_reserved == max);
  const uint64_t shadow = b.usage().graph_mem_reserved;
  CHECK((reserved > shadow ? reserved - shadow : shadow - reserved) <= g);
  // A graph whose output outlives the launch: live until freed outside.
  ok(b.begin_capture(s));
  const DevPtr out = take(b.malloc_async(32 * kMiB, s));
  ok(b.fill(out, 32 * kMiB, 0x0707u, s));
  const GraphHandle producer = take(b.end_capture(s));
  CHECK(b.fill(out, 32 * kMiB, 1, kS0).error().code == ErrorCode::kInvalidArgument);  // not live
  ok(b.launch(producer, s));
  ok(b.synchronize());
  CHECK(gpu.mismatches(out, 32 * kMiB, 0x0707u) == 0);
  ok(b.free_async(out, s));
  for (const GraphHandle gh : graphs) ok(b.destroy_graph(gh));
  ok(b.destroy_graph(producer));
  ok(b.synchronize());
  ok(b.graph_mem_trim());
  const auto trimmed = take(b.observe());
  CHECK(trimmed.graph_reserved_current == before.graph_reserved_current);
  CHECK(b.usage().graph_mem_reserved == 0);
}

TEST_CASE("destroying the backend releases everything it still holds") {
  Gpu keeper;  // keeps the context and the kernels loaded while the other backend comes and goes
  const DevPtr warm = take(keeper.b->device_malloc(kMiB, "warm"));
  ok(keeper.b->fill(warm, kMiB, 1, kS0));
  CHECK(keeper.mismatches(warm, kMiB, 1) == 0);
  ok(keeper.b->synchronize());
  ok(keeper.b->graph_mem_trim());
  const uint64_t base = take(keeper.b->observe()).free_bytes;
  for (const bool explicit_release : {false, true}) {
    auto gpu = std::make_unique<Gpu>();
    CudaBackend& b = *gpu->b;
    const uint64_t g = b.granularity();
    const PhysHandle h1 = take(b.create_physical(4 * g, "h1"));
    const PhysHandle h2 = take(b.create_physical(g, "h2"));
    (void)take(b.create_physical(g, "unmapped"));
    gpu->mapped(h1, 4 * g);
    gpu->mapped(h1, 4 * g);
    gpu->mapped(h2, g);
    ok(b.release_physical(h2));  // released, still mapped
    (void)take(b.reserve_virtual(8 * g, 0));
    (void)take(b.device_malloc(64 * kMiB, "plain"));
    const DevPtr a = take(b.malloc_async(32 * kMiB, kS0));
    ok(b.fill(a, 32 * kMiB, 3, kS0));
    (void)take(b.host_malloc_pinned(4 * kMiB));
    const StreamId s = take(b.create_stream());
    ok(b.begin_capture(s));
    (void)take(b.malloc_async(16 * kMiB, s));  // an output left live after the launch
    const GraphHandle gh = take(b.end_capture(s));
    ok(b.launch(gh, s));
    ok(b.begin_capture(s));  // a capture left open
    (void)take(b.malloc_async(8 * kMiB, s));
    if (explicit_release) {
      ok(b.release_everything());
      const Usage u = b.usage();
      CHECK(u.physical_bytes == 0);
      CHECK(u.virtual_reserved == 0);
      CHECK(u.virtual_mapped == 0);
      CHECK(u.pinned_host_bytes == 0);
      CHECK(b.create_physical(g, "late").error().code == ErrorCode::kInvalidState);
    }
    gpu.reset();
    const uint64_t now_free = take(keeper.b->observe()).free_bytes;
    INFO("free before " << base << ", after " << now_free);
    CHECK(now_free + 2 * kMiB >= base);
    CHECK(now_free <= base + 2 * kMiB);
  }
}

TEST_CASE("measured durations accumulate per primitive") {
  Gpu gpu;
  CudaBackend& b = *gpu.b;
  const uint64_t g = b.granularity();
  const PhysHandle h = take(b.create_physical(g, "t"));
  const DevPtr va = gpu.mapped(h, g);
  ok(b.fill(va, g, 5, kS0));
  ok(b.unmap(va, g));
  ok(b.release_physical(h));
  ok(b.free_virtual(va));
  for (const P p : {P::kCreatePhysical, P::kReserveVirtual, P::kMap, P::kSetAccess, P::kFill,
                    P::kUnmap, P::kReleasePhysical, P::kFreeVirtual}) {
    INFO(to_string(p));
    CHECK(b.measured_calls_of(p) == 1);
    CHECK(b.measured_calls_of(p) == b.calls_of(p));
    CHECK(b.measured_time_in(p) > 0);
  }
  CHECK(b.measured_calls_of(P::kCopy) == 0);
  CHECK(b.measured_time_in(P::kCopy) == 0);
  // With sync_for_timing the fill's GPU time is inside the measurement: 1 GiB at most ~5 TB/s.
  Gpu synced(true);
  const DevPtr big = take(synced.b->device_malloc(1024 * kMiB, "big"));
  ok(synced.b->fill(big, 1024 * kMiB, 7, kS0));
  ok(synced.b->fill(big, 1024 * kMiB, 8, kS0));
  CHECK(synced.b->measured_time_in(P::kFill) >= 2 * 150'000);
  CHECK(synced.mismatches(big, 1024 * kMiB, 8) == 0);
}

TEST_CASE("nodes enqueued on the native stream during a capture are priced in the shadow") {
  Gpu gpu;
  CudaBackend& b = *gpu.b;
  const DevPtr buf = take(b.device_malloc(3 * kMiB, "buf"));
  const Status outside = b.add_captured_nodes(kS0, 3);
  REQUIRE_FALSE(outside.ok());
  CHECK(outside.error().code == ErrorCode::kInvalidState);
  // Three fill kernels launched beside the backend (as the model executor launches its step).
  void* cs = reinterpret_cast<void*>(take(b.native_stream(kS0)));
  ok(b.begin_capture(kS0));
  for (uint32_t i = 0; i < 3; ++i)
    REQUIRE(launch_fill(cs, buf + i * kMiB, kMiB, 0x51u + i) == cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(cs), &status, nullptr, &graph) ==
          cudaSuccess);
  size_t real = 0;
  REQUIRE(cudaGraphGetNodes(graph, nullptr, &real) == cudaSuccess);
  CHECK(real == 3);  // the graph has them; the backend has not seen them
  CHECK(b.shadow().nodes_in_capture(kS0) == 0);
  ok(b.add_captured_nodes(kS0, 3));
  CHECK(b.shadow().nodes_in_capture(kS0) == 3);
  const SimTime captured = b.time_in(P::kEndCapture);
  const GraphHandle gh = take(b.end_capture(kS0));
  // 10 us a call, and 1 + 3 us a node captured and instantiated.
  CHECK(b.time_in(P::kEndCapture) - captured == (10 + 3 * 4) * 1000);
  const SimTime launched = b.time_in(P::kLaunch);
  ok(b.launch(gh, kS0));
  CHECK(b.time_in(P::kLaunch) - launched == 10'000 + 3 * 500);  // the first launch uploads them
  for (uint32_t i = 0; i < 3; ++i) CHECK(gpu.mismatches(buf + i * kMiB, kMiB, 0x51u + i) == 0);
  ok(b.destroy_graph(gh));
  ok(b.device_free(buf));
}

TEST_CASE("fault injection passes through to the shadow; the driver is not called") {
  Gpu gpu(false, {FaultInjection{P::kCreatePhysical, 2, 1}, FaultInjection{P::kMap, 1, 1}});
  CudaBackend& b = *gpu.b;
  const uint64_t g = b.granularity();
  const PhysHandle h = take(b.create_physical(g, "a"));
  const auto failed = b.create_physical(g, "b");
  REQUIRE(!failed.ok());
  CHECK(failed.error().code == ErrorCode::kOutOfMemory);
  CHECK(b.calls_of(P::kCreatePhysical) == 2);
  CHECK(b.measured_calls_of(P::kCreatePhysical) == 1);
  const DevPtr va = take(b.reserve_virtual(g, 0));
  CHECK(b.map(va, g, h, 0).error().code == ErrorCode::kOutOfMemory);
  CHECK(b.measured_calls_of(P::kMap) == 0);
  ok(b.map(va, g, h, 0));
  ok(b.set_access(va, g));
  ok(b.fill(va, g, 9, kS0));
  CHECK(gpu.mismatches(va, g, 9) == 0);
  CHECK(b.usage().physical_bytes == g);
}

struct FailingCall {
  const char* impl;
  P primitive;
  uint64_t call;
};

// A small Llama-shaped model; from call k on, the chosen primitive fails in the shadow. The run
// reports the failure, and everything it allocated is back on the GPU.
void check_failing_call(const FailingCall& k) {
  const ModelShape m = test::tiny_llama();
  INFO(k.impl << " fails at " << to_string(k.primitive) << " call " << k.call);
  uint64_t free_before = 0;
  {
    Gpu probe;
    free_before = take(probe.b->observe()).free_bytes;
  }
  Gpu gpu(false, {FaultInjection{k.primitive, k.call, UINT64_MAX}});
  CaptureRunConfig c;
  c.model = m;
  c.gemm_workspace_bytes = 4 * kMiB;
  c.max_model_len = 2048;
  c.capture_sizes = {1, 2, 4, 8, 16, 32, 64};
  c.runners = GraphRunners::kPiecewise;
  auto strategy = graph_strategies().find(k.impl)->parse(ConfigNode::parse("{}", "test"))(*gpu.b);
  const CaptureRunResult r = run_captures(c, *gpu.b, gpu.clock, *strategy, gpu.metrics);
  CHECK_FALSE(r.ok);
  CHECK(r.out_of_memory);
  CHECK(r.invariant_violation == "");
  CHECK(r.released_all);
  strategy.reset();
  ok(gpu.b->synchronize());
  // Everything the run allocated is back: the device's free memory is where it started (the
  // backend's own context aside), before the backend itself is destroyed.
  const uint64_t free_after = take(gpu.b->observe()).free_bytes;
  CHECK(free_after + 2 * kMiB >= free_before);
}

TEST_CASE("a failing call in the middle of every pool and VMM strategy leaves nothing on the GPU") {
  const FailingCall cases[] = {{"private_pools", P::kDeviceMalloc, 6},
                               {"shared_pool", P::kDeviceMalloc, 4},
                               {"global_pool", P::kDeviceMalloc, 4},
                               {"vmm_alias", P::kMap, 30},
                               {"vmm_alias", P::kCreatePhysical, 8}};
  for (const FailingCall& k : cases) check_failing_call(k);
}

// Tagged [graph-mem-reuse]: these graphs reuse a virtual address within one graph for a smaller
// allocation, which compute-sanitizer memcheck misreports as out of bounds (docs/sanitizers.md,
// tools/repro/graph_mem_nodes_memcheck.cu); the memcheck run excludes the tag, racecheck and
// synccheck run it.
TEST_CASE("a failing call in the middle of graph_mem_nodes leaves nothing on the GPU",
          "[graph-mem-reuse]") {
  const FailingCall cases[] = {{"graph_mem_nodes", P::kLaunch, 4},
                               {"graph_mem_nodes", P::kMallocAsync, 40}};
  for (const FailingCall& k : cases) check_failing_call(k);
}

// Once the process has warmed up, another warm-up (every kind of call the validation modes make,
// through a throwaway backend) leaves the device's free memory exactly as it was.
TEST_CASE("warm_up_cuda_process leaves nothing behind once the process has warmed up") {
  REQUIRE(warm_up_cuda_process(0).ok());
  Gpu gpu;
  const auto before = take(gpu.b->observe());
  REQUIRE(warm_up_cuda_process(0).ok());
  const auto after = take(gpu.b->observe());
  CHECK(after.free_bytes == before.free_bytes);
}

}  // namespace
}  // namespace memsim

// Without a CUDA device the whole file is skipped (exit 77), as Meson expects.
int main(int argc, char** argv) {
  return memsim::run_on_gpu("test_cuda_backend", memsim::test_gpu(), argc, argv);
}
