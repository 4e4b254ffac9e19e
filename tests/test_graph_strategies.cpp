// Conformance suite: the same capture schedules run against every registered graph-memory
// strategy, checking the role contract, teardown, fault paths and the max/sum relations.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "backends/sim/sim_backend.h"
#include "src/drivers/capture_runner.h"
#include "src/graph/registry.h"
#include "tests/tiny_model.h"

using namespace memsim;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

GpuSpec test_gpu(uint64_t capacity = 8ull << 30) {
  GpuSpec g;
  g.name = "test";
  g.capacity = capacity;
  g.granularity = 2 * kMiB;
  g.va_space = 1ull << 46;
  for (auto& c : g.costs) c.per_call_us = 1.0;
  g.cost(Primitive::kMap).per_call_us = 2.0;
  g.cost(Primitive::kSetAccess).per_handle_us = 30.0;
  return g;
}

CaptureRunConfig base_config() {
  CaptureRunConfig c;
  c.model = test::tiny_llama();
  c.gemm_workspace_bytes = 4 * kMiB;
  c.max_model_len = 2048;
  c.capture_sizes = {1, 2, 4, 8, 16, 24, 32, 48, 64};
  c.dynamic.arrivals = 200;
  return c;
}

struct Outcome {
  CaptureRunResult result;
  Usage after;
  std::string backend_violation;
};

Outcome run(const std::string& impl, const CaptureRunConfig& c, std::vector<FaultInjection> f = {},
            const std::string& params = "{}") {
  SimClock clock;
  MetricsRecorder metrics(clock);
  SimBackend backend(test_gpu(), clock, &metrics, std::move(f));
  auto factory = graph_strategies().find(impl)->parse(ConfigNode::parse(params, "<test>"));
  auto strategy = factory(backend);
  Outcome o;
  o.result = run_captures(c, backend, clock, *strategy, metrics);
  o.after = backend.usage();
  std::string why;
  if (!backend.check_invariants(&why)) o.backend_violation = why;
  return o;
}

struct Standalone {
  uint64_t max = 0;
  uint64_t sum = 0;
};

// Footprint of each shape captured alone with `impl`: their max and sum.
Standalone standalone(const std::string& impl, const CaptureRunConfig& c) {
  Standalone r;
  for (uint32_t b : c.capture_sizes) {
    CaptureRunConfig one = c;
    one.capture_sizes = {b};
    one.inputs_sized_for = b;
    one.arrival = Arrival::kFixed;
    const uint64_t bytes = run(impl, one).result.peak_physical;
    r.max = std::max(r.max, bytes);
    r.sum += bytes;
  }
  return r;
}

}  // namespace

TEST_CASE("every strategy honours the contract in every variant", "[conformance]") {
  for (const GraphEntry& info : graph_strategies()) {
    for (auto outputs : {OutputLifetime::kStrong, OutputLifetime::kWeak})
      for (auto arrival : {Arrival::kFixed, Arrival::kDynamic})
        for (auto runners : {GraphRunners::kFull, GraphRunners::kPiecewise, GraphRunners::kBoth})
          for (auto inputs : {InputBuffers::kPersistent, InputBuffers::kPerShape}) {
            CaptureRunConfig c = base_config();
            c.outputs = outputs;
            c.arrival = arrival;
            c.runners = runners;
            c.inputs = inputs;
            c.order = CaptureOrder::kLargeFirst;
            INFO(fmt::format("{} {}/{}/{}/{}", info.name, to_string(outputs), to_string(arrival),
                             to_string(runners), to_string(inputs)));
            const Outcome o = run(info.name, c);
            CHECK(o.result.ok);
            CHECK(o.result.failure == "");
            // No overlapping live tensors, strategy bytes == backend bytes held for it.
            CHECK(o.result.invariant_violation == "");
            CHECK(o.backend_violation == "");
            // Everything returned at the end.
            CHECK(o.result.released_all);
            CHECK(o.after.physical_bytes == 0);
            CHECK(o.after.virtual_mapped == 0);
            CHECK(o.after.virtual_reserved == 0);
            CHECK(o.result.peak_strategy_reserved <= o.result.peak_physical);
            // Driver-managed graph memory is the driver's graph memory, and only it is.
            CHECK((o.result.peak_graph_mem > 0) == info.traits.driver_managed_memory);
            if (arrival == Arrival::kFixed) {
              CHECK(o.result.shapes_captured == c.capture_sizes.size());
              CHECK(o.result.curve.size() == c.capture_sizes.size());
            }
            CHECK(o.result.shapes_captured > 0);
          }
  }
}

TEST_CASE("footprints relate to max(shape) and sum(shape) as the strategies promise",
          "[conformance]") {
  CaptureRunConfig c = base_config();
  c.outputs = OutputLifetime::kWeak;
  const Standalone ref = standalone("private_pools", c);
  const uint64_t max_shape = ref.max, sum_shape = ref.sum;
  REQUIRE(max_shape > 0);
  REQUIRE(sum_shape > 2 * max_shape);
  const uint64_t granule = 2 * kMiB;

  // vmm_alias: physical is max(shape) (its pools carve the same segments, shared physically).
  const Outcome vmm = run("vmm_alias", c);
  CHECK(vmm.result.peak_physical == max_shape);
  CHECK(vmm.result.peak_virtual_mapped > vmm.result.peak_physical);
  CHECK(vmm.result.switch_time > 0);

  // graph_mem_nodes: max of its own standalone footprints, up to one granule.
  const uint64_t nodes_max = standalone("graph_mem_nodes", c).max;
  const Outcome nodes = run("graph_mem_nodes", c);
  CHECK(nodes.result.peak_physical <= nodes_max + granule);
  CHECK(nodes.result.peak_physical + granule >= nodes_max);

  // private_pools approaches sum(shape): only inputs and the workspace are shared.
  const Outcome priv = run("private_pools", c);
  CHECK(priv.result.peak_physical > 3 * max_shape);
  CHECK(priv.result.peak_physical > sum_shape / 3);
  CHECK(priv.result.peak_physical <= sum_shape);

  // shared_pool falls between, and large_first reuses more than arrival order.
  c.order = CaptureOrder::kArrival;
  const Outcome arrival = run("shared_pool", c);
  c.order = CaptureOrder::kLargeFirst;
  const Outcome large = run("shared_pool", c);
  CHECK(large.result.peak_physical >= max_shape);
  CHECK(large.result.peak_physical <= arrival.result.peak_physical);
  CHECK(arrival.result.peak_physical <= priv.result.peak_physical);
  CHECK(large.result.peak_physical < priv.result.peak_physical);
}

TEST_CASE("global_pool shares one pool across runners, shared_pool one per runner",
          "[conformance]") {
  CaptureRunConfig c = base_config();
  c.outputs = OutputLifetime::kWeak;
  c.runners = GraphRunners::kBoth;
  c.order = CaptureOrder::kLargeFirst;
  const Outcome shared = run("shared_pool", c);
  const Outcome global = run("global_pool", c);
  REQUIRE(shared.result.ok);
  REQUIRE(global.result.ok);
  CHECK(global.result.peak_physical < shared.result.peak_physical);
  // With one runner the two are the same strategy.
  c.runners = GraphRunners::kFull;
  CHECK(run("shared_pool", c).result.peak_physical == run("global_pool", c).result.peak_physical);
}

TEST_CASE("strong outputs stay allocated; vmm_alias says it cannot preserve them",
          "[conformance]") {
  CaptureRunConfig c = base_config();
  c.order = CaptureOrder::kLargeFirst;
  c.outputs = OutputLifetime::kWeak;
  const uint64_t weak = run("shared_pool", c).result.peak_physical;
  c.outputs = OutputLifetime::kStrong;
  const Outcome strong = run("shared_pool", c);
  CHECK(strong.result.peak_physical > weak);
  CHECK(strong.result.held_outputs_preserved);
  CHECK_FALSE(run("vmm_alias", c).result.held_outputs_preserved);
  CHECK(run("graph_mem_nodes", c).result.held_outputs_preserved);
}

TEST_CASE("a failing primitive mid-strategy is reported and leaks nothing",
          "[conformance][fault]") {
  struct Case {
    const char* impl;
    Primitive primitive;
    uint64_t call;
  };
  const std::vector<Case> cases = {
      {"private_pools", Primitive::kDeviceMalloc, 7},
      {"shared_pool", Primitive::kDeviceMalloc, 4},
      {"global_pool", Primitive::kDeviceMalloc, 5},
      {"vmm_alias", Primitive::kCreatePhysical, 9},
      {"vmm_alias", Primitive::kMap, 40},
      {"vmm_alias", Primitive::kSetAccess, 25},
      {"vmm_alias", Primitive::kReserveVirtual, 3},
      {"graph_mem_nodes", Primitive::kMallocAsync, 30},
      {"graph_mem_nodes", Primitive::kLaunch, 3},
  };
  for (const Case& k : cases) {
    for (auto runners : {GraphRunners::kFull, GraphRunners::kPiecewise}) {
      INFO(fmt::format("{} fails at {} call {} ({})", k.impl, to_string(k.primitive), k.call,
                       to_string(runners)));
      CaptureRunConfig c = base_config();
      c.runners = runners;
      // From call k on, every call fails (a single failure is retried away by the caching
      // allocator, as PyTorch's malloc retries after releasing cached blocks).
      const Outcome o = run(k.impl, c, {FaultInjection{k.primitive, k.call, UINT64_MAX}});
      CHECK_FALSE(o.result.ok);
      CHECK(o.result.out_of_memory);
      CHECK(o.result.failed_batch > 0);
      CHECK(o.result.invariant_violation == "");
      CHECK(o.backend_violation == "");
      CHECK(o.result.released_all);
      CHECK(o.after.physical_bytes == 0);
      CHECK(o.after.virtual_reserved == 0);
    }
  }
}

TEST_CASE("one transient segment failure is absorbed by the allocator's retry", "[fault]") {
  for (const char* impl : {"private_pools", "shared_pool", "global_pool"}) {
    INFO(impl);
    const Outcome o = run(impl, base_config(), {FaultInjection{Primitive::kDeviceMalloc, 4, 1}});
    CHECK(o.result.ok);
    CHECK(o.result.released_all);
  }
}

TEST_CASE("out of device memory is an outcome naming the shape and the shortfall",
          "[conformance]") {
  CaptureRunConfig c = base_config();
  c.outputs = OutputLifetime::kStrong;
  SimClock clock;
  MetricsRecorder metrics(clock);
  SimBackend backend(test_gpu(96 * kMiB), clock, &metrics);
  auto strategy =
      graph_strategies().find("private_pools")->parse(ConfigNode::parse("{}", "t"))(backend);
  const CaptureRunResult r = run_captures(c, backend, clock, *strategy, metrics);
  CHECK_FALSE(r.ok);
  CHECK(r.out_of_memory);
  CHECK(r.bytes_short > 0);
  CHECK(r.failed_batch > 1);
  CHECK(r.shapes_captured > 0);
  CHECK(r.shapes_captured < c.capture_sizes.size());
  CHECK(r.released_all);
}

TEST_CASE("runs are bit-reproducible for a seed", "[conformance]") {
  CaptureRunConfig c = base_config();
  c.arrival = Arrival::kDynamic;
  c.seed = 42;
  for (const char* impl : {"shared_pool", "graph_mem_nodes"}) {
    const Outcome a = run(impl, c), b = run(impl, c);
    REQUIRE(a.result.curve.size() == b.result.curve.size());
    for (size_t i = 0; i < a.result.curve.size(); ++i) {
      CHECK(a.result.curve[i].batch == b.result.curve[i].batch);
      CHECK(a.result.curve[i].time == b.result.curve[i].time);
      CHECK(a.result.curve[i].physical == b.result.curve[i].physical);
    }
    CHECK(a.result.end_time == b.result.end_time);
    c.seed = 43;
    const Outcome other = run(impl, c);
    CHECK(other.result.end_time != a.result.end_time);
    c.seed = 42;
  }
}

TEST_CASE("vLLM capture sizes", "[schedule]") {
  const auto s = vllm_capture_sizes(256);
  REQUIRE(s.size() == 51);
  CHECK(s[0] == 1);
  CHECK(s[1] == 2);
  CHECK(s[2] == 4);
  CHECK(s[3] == 8);
  CHECK(s[34] == 256);
  CHECK(s[35] == 272);
  CHECK(s.back() == 512);
  CHECK(vllm_capture_sizes(8) == std::vector<uint32_t>{1, 2, 4, 8, 16});
  CHECK(vllm_capture_sizes(1) == std::vector<uint32_t>{1, 2});
}
