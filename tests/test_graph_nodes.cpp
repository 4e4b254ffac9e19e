// Graph memory node semantics on the sim backend, held to what the H200's driver did in the same
// scenarios (tools/repro/graph_node_semantics.cu; tests/test_graph_nodes_cuda.cpp on the GPU).
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "tests/graph_node_scenarios.h"
#include "tests/sim_backend_test_util.h"

namespace memsim {
namespace {

using graph_nodes::kMiB;
using test::expect_cost;
using test::P;

// The test GPU with the H200's graph-memory chunk and room for the scenarios.
GpuSpec node_gpu() {
  GpuSpec g = test::test_gpu();
  g.capacity = 16ull << 30;
  g.graph_mem_chunk = 32 * kMiB;
  return g;
}

struct NodeSim {
  SimClock clock;
  MetricsRecorder metrics{clock};
  SimBackend b{node_gpu(), clock, &metrics};
};

// Driver 580 on an H200 (tools/repro/graph_node_semantics.cu, 2026-11-27).
const std::map<std::string, int64_t> kH200Values = {
    {"relaunch with a live output refused", 1},
    {"relaunch with AutoFreeOnLaunch refused", 0},
    {"layout offset 1", 1024},
    {"layout offset 2", 2048},
    {"layout offset 3", 3074 * 1024},
    {"layout offset 4", 3075 * 1024},
    {"layout offset 5", 44035 * 1024},
    {"fork/join: other branch offset", 64 * kMiB},
    {"fork/join: same branch after the free offset", 0},
    {"fork/join: after the join offset", 0},
    {"unjoined end refused", 1},
    {"reuse 67108864 then 67108864: offset", 0},
    {"reuse 67108864 then 33554432: offset", 0},
    {"reuse 67108864 then 100663296: offset", 64 * kMiB},
    {"reuse 3072 then 2048: offset", 0},
    {"reuse 2048 then 3072: offset", 2048},
    {"reuse 3145728 then 4194304: offset", 3 * kMiB},
    {"reuse 4194304 then 3145728: offset", 0},
    {"reuse 2097152 then 2097153: offset", 2 * kMiB},
    {"reuse 41943040 then 8388608: offset", 0},
};
const std::map<std::string, uint64_t> kH200ReservedMiB = {
    {"autofree", 64},
    {"layout", 96},
    {"two graphs, one stream", 256},
    {"two graphs, two streams, idle between", 256},
    {"two graphs, two streams, back to back", 512},
    {"fork/join", 128},
    {"held: g1", 64},
    {"held: g2 after g1", 64},
    {"held: g1 while g2's output is live", 128},
    {"held: g1 after the output is freed", 128},
    {"upload", 256},
    {"upload, then launches on another stream", 256},
    {"reuse 67108864 then 67108864", 64},
    {"reuse 67108864 then 33554432", 64},
    {"reuse 67108864 then 100663296", 160},
    {"reuse 3072 then 2048", 32},
    {"reuse 2048 then 3072", 32},
    {"reuse 3145728 then 4194304", 32},
    {"reuse 4194304 then 3145728", 32},
    {"reuse 2097152 then 2097153", 32},
    {"reuse 41943040 then 8388608", 64},
};

// Compares key by key, so that a failure names the scenario's observation.
template <class V>
void same_map(const std::map<std::string, V>& got, const std::map<std::string, V>& want) {
  for (const auto& [key, v] : want) {
    INFO(key);
    REQUIRE(got.count(key) == 1);
    CHECK(got.at(key) == v);
  }
  CHECK(got.size() == want.size());
}

TEST_CASE("graph memory nodes: every scenario gives the H200's addresses and reservations",
          "[graph_nodes]") {
  NodeSim s;
  const StreamId s1 = *s.b.create_stream(), s2 = *s.b.create_stream();
  graph_nodes::Observations o;
  std::map<std::string, uint64_t> reserved;
  o.reserved = [&](const std::string& at) { reserved[at] = s.b.usage().graph_mem_reserved; };
  for (const auto& [name, run] : graph_nodes::all_scenarios(s1, s2)) {
    INFO("scenario " << name);
    const Status st = run(s.b, o);
    REQUIRE(st.ok());
    CHECK(s.b.usage().graph_mem_reserved == 0);  // each ends trimmed, nothing live
    std::string why;
    CHECK(s.b.check_invariants(&why));
    INFO(why);
  }
  same_map(o.values, kH200Values);
  std::map<std::string, uint64_t> reserved_mib;
  for (const auto& [at, bytes] : reserved) reserved_mib[at] = bytes / kMiB;
  same_map(reserved_mib, kH200ReservedMiB);
  CHECK(s.b.usage().virtual_mapped == 0);  // every graph's addresses given back
}

TEST_CASE("graph memory nodes: a remap is priced when another graph's output holds the pages",
          "[graph_nodes]") {
  NodeSim s;
  const StreamId st = *s.b.create_stream();
  DevPtr a = 0, out = 0;
  const GraphHandle g1 = *graph_nodes::one_alloc(s.b, st, 64 * kMiB, true, &a);
  const GraphHandle g2 = *graph_nodes::one_alloc(s.b, st, 64 * kMiB, false, &out);
  // First launch: the fill node uploaded (0.5 us) and 32 granules mapped (4 us each).
  expect_cost(s.b, P::kLaunch, 2500 + 1 * 500 + 32 * 4000,
              [&] { REQUIRE(s.b.launch(g1, st).ok()); });
  expect_cost(s.b, P::kLaunch, 2500, [&] { REQUIRE(s.b.launch(g1, st).ok()); });
  expect_cost(s.b, P::kLaunch, 2500 + 1 * 500 + 32 * 4000,
              [&] { REQUIRE(s.b.launch(g2, st).ok()); });
  // g2's output took g1's pages: 32 granules remapped at 8 us (H200: 147.4 against 9.1 us).
  expect_cost(s.b, P::kLaunch, 2500 + 32 * 8000, [&] { REQUIRE(s.b.launch(g1, st).ok()); });
  expect_cost(s.b, P::kLaunch, 2500, [&] { REQUIRE(s.b.launch(g1, st).ok()); });
}

TEST_CASE("graph memory nodes: upload maps and uploads once, a launch after it does not",
          "[graph_nodes]") {
  NodeSim s;
  const StreamId s1 = *s.b.create_stream(), s2 = *s.b.create_stream();
  DevPtr a = 0;
  const GraphHandle g = *graph_nodes::one_alloc(s.b, s1, 64 * kMiB, true, &a);
  expect_cost(s.b, P::kUpload, 2500 + 1 * 500 + 32 * 4000,
              [&] { REQUIRE(s.b.upload(g, s1).ok()); });
  CHECK(s.b.usage().graph_mem_reserved == 64 * kMiB);
  CHECK(s.b.usage().graph_mem_used == 0);
  expect_cost(s.b, P::kLaunch, 2500, [&] { REQUIRE(s.b.launch(g, s2).ok()); });
}

TEST_CASE("graph memory nodes: capture ordering misuse is refused and changes nothing",
          "[graph_nodes]") {
  NodeSim s;
  const StreamId s1 = *s.b.create_stream(), s2 = *s.b.create_stream(), s3 = *s.b.create_stream();
  REQUIRE(s.b.begin_capture(s1).ok());
  REQUIRE(s.b.begin_capture(s3).ok());
  CHECK(!s.b.stream_wait(s1, s2).ok());  // a capture cannot wait on work outside it
  CHECK(!s.b.stream_wait(s1, s3).ok());  // nor merge with another capture
  CHECK(!s.b.synchronize().ok());        // illegal while capturing
  REQUIRE(s.b.stream_wait(s2, s1).ok());
  CHECK(*s.b.capture_origin(s2) == s1);
  CHECK(!s.b.end_capture(s2).ok());  // a forked stream does not end the capture
  const DevPtr p = *s.b.malloc_async(kMiB, s2);
  REQUIRE(s.b.free_async(p, s1).ok());
  const Usage before = s.b.usage();
  CHECK(!s.b.end_capture(s1).ok());  // s2 worked since the fork: not joined
  CHECK(s.b.usage().virtual_mapped == before.virtual_mapped);
  CHECK(s.b.nodes_in_capture(s1) == 2);
  REQUIRE(s.b.stream_wait(s1, s2).ok());
  REQUIRE(s.b.end_capture(s1).ok());
  CHECK(!s.b.capture_origin(s2));
  REQUIRE(s.b.end_capture(s3).ok());
  std::string why;
  CHECK(s.b.check_invariants(&why));
  INFO(why);
}

}  // namespace
}  // namespace memsim
