// Graph memory node scenarios written once against the Backend: the sim test holds them to the
// H200's figures, the GPU test runs them on the driver and on a SimBackend side by side.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace memsim::graph_nodes {

constexpr uint64_t kMiB = 1ull << 20;

// What a scenario saw: named values (address offsets, refusals), and `reserved` called at named
// checkpoints (the backend's or the driver's graph-memory reservation, as the test wants it).
struct Observations {
  std::function<void(const std::string&)> reserved;
  std::map<std::string, int64_t> values;
};

// A graph of one allocation of `bytes`, used by one fill, freed in the graph or not.
inline Result<GraphHandle> one_alloc(Backend& b, StreamId s, uint64_t bytes, bool free_it,
                                     DevPtr* out, GraphOptions options = {}) {
  MEMSIM_TRY(b.begin_capture(s));
  MEMSIM_ASSIGN_OR_RETURN(*out, b.malloc_async(bytes, s));
  MEMSIM_TRY(b.fill(*out, bytes, 1, s));
  if (free_it) MEMSIM_TRY(b.free_async(*out, s));
  return b.end_capture(s, options);
}

// Ends a scenario: the device idle, every graph destroyed, the pool trimmed.
inline Status finish(Backend& b, const std::vector<GraphHandle>& graphs) {
  MEMSIM_TRY(b.synchronize());
  for (GraphHandle g : graphs) MEMSIM_TRY(b.destroy_graph(g));
  return b.graph_mem_trim();
}

// Without AutoFreeOnLaunch a graph whose output is live refuses to launch again.
inline Status auto_free(Backend& b, StreamId s, Observations& o) {
  DevPtr out = 0;
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, one_alloc(b, s, 64 * kMiB, false, &out, {false}));
  MEMSIM_TRY(b.launch(g, s));
  const Status again = b.launch(g, s);
  o.values["relaunch with a live output refused"] = !again.ok();
  MEMSIM_TRY(b.free_async(out, s));
  MEMSIM_TRY(b.launch(g, s));
  MEMSIM_TRY(b.free_async(out, s));
  DevPtr out2 = 0;
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle h, one_alloc(b, s, 64 * kMiB, false, &out2));
  MEMSIM_TRY(b.launch(h, s));
  o.values["relaunch with AutoFreeOnLaunch refused"] = !b.launch(h, s).ok();
  o.reserved("autofree");
  MEMSIM_TRY(b.free_async(out2, s));
  return finish(b, {g, h});
}

// `first` bytes freed, then `second` allocated, in one graph: where does the second go?
inline Status reuse(Backend& b, StreamId s, uint64_t first, uint64_t second, Observations& o) {
  MEMSIM_TRY(b.begin_capture(s));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr a, b.malloc_async(first, s));
  MEMSIM_TRY(b.fill(a, first, 1, s));
  MEMSIM_TRY(b.free_async(a, s));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr c, b.malloc_async(second, s));
  MEMSIM_TRY(b.fill(c, second, 1, s));
  MEMSIM_TRY(b.free_async(c, s));
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, b.end_capture(s));
  MEMSIM_TRY(b.launch(g, s));
  const std::string name = "reuse " + std::to_string(first) + " then " + std::to_string(second);
  o.values[name + ": offset"] = static_cast<int64_t>(c - a);
  o.reserved(name);
  return finish(b, {g});
}

// Six allocations live at once (1 KiB, 1 KiB, 3 MiB, 1 KiB, 40 MiB, 1 KiB): their offsets.
inline Status layout(Backend& b, StreamId s, Observations& o) {
  const uint64_t kib[] = {1, 1, 3072, 1, 40960, 1};
  std::vector<DevPtr> p;
  MEMSIM_TRY(b.begin_capture(s));
  for (uint64_t k : kib) {
    MEMSIM_ASSIGN_OR_RETURN(DevPtr q, b.malloc_async(k << 10, s));
    MEMSIM_TRY(b.fill(q, k << 10, 1, s));
    p.push_back(q);
  }
  for (DevPtr q : p) MEMSIM_TRY(b.free_async(q, s));
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, b.end_capture(s));
  MEMSIM_TRY(b.launch(g, s));
  for (size_t i = 1; i < p.size(); ++i)
    o.values["layout offset " + std::to_string(i)] = static_cast<int64_t>(p[i] - p[0]);
  o.reserved("layout");
  return finish(b, {g});
}

// Two 256 MiB graphs (freed inside): on one stream; on two with the device idle in between;
// on two back to back. (Ordering by an event does not let them share while the first runs, and
// a graph that finished unobserved shares on the GPU but not in the sim: the model's header.)
inline Status two_streams(Backend& b, StreamId s1, StreamId s2, Observations& o) {
  DevPtr a = 0, c = 0;
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle ga, one_alloc(b, s1, 256 * kMiB, true, &a));
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle gb, one_alloc(b, s1, 256 * kMiB, true, &c));
  MEMSIM_TRY(b.launch(ga, s1));
  MEMSIM_TRY(b.launch(gb, s1));
  o.reserved("two graphs, one stream");
  MEMSIM_TRY(b.synchronize());
  MEMSIM_TRY(b.launch(gb, s2));
  MEMSIM_TRY(b.synchronize());
  o.reserved("two graphs, two streams, idle between");
  for (int i = 0; i < 3; ++i) {
    MEMSIM_TRY(b.launch(ga, s1));
    MEMSIM_TRY(b.launch(gb, s2));
  }
  MEMSIM_TRY(b.synchronize());
  o.reserved("two graphs, two streams, back to back");
  return finish(b, {ga, gb});
}

// A capture forked into s2 and joined back: 64 MiB allocated and freed on each branch, again on
// s1 after its free (parallel to s2's), and once more after the join.
inline Status fork_join(Backend& b, StreamId s1, StreamId s2, Observations& o) {
  MEMSIM_TRY(b.begin_capture(s1));
  MEMSIM_TRY(b.stream_wait(s2, s1));  // fork
  DevPtr p[4];
  const StreamId on[4] = {s1, s2, s1, s1};
  for (int i = 0; i < 4; ++i) {
    if (i == 3) MEMSIM_TRY(b.stream_wait(s1, s2));  // join
    MEMSIM_ASSIGN_OR_RETURN(p[i], b.malloc_async(64 * kMiB, on[i]));
    MEMSIM_TRY(b.fill(p[i], 64 * kMiB, 1, on[i]));
    MEMSIM_TRY(b.free_async(p[i], on[i]));
  }
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, b.end_capture(s1));
  MEMSIM_TRY(b.launch(g, s1));
  o.values["fork/join: other branch offset"] = static_cast<int64_t>(p[1] - p[0]);
  o.values["fork/join: same branch after the free offset"] = static_cast<int64_t>(p[2] - p[0]);
  o.values["fork/join: after the join offset"] = static_cast<int64_t>(p[3] - p[0]);
  o.reserved("fork/join");
  return finish(b, {g});
}

// A fork never joined back: end_capture refuses; joined, it ends.
inline Status unjoined(Backend& b, StreamId s1, StreamId s2, Observations& o) {
  MEMSIM_TRY(b.begin_capture(s1));
  MEMSIM_TRY(b.stream_wait(s2, s1));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr p, b.malloc_async(kMiB, s2));
  MEMSIM_TRY(b.free_async(p, s2));
  o.values["unjoined end refused"] = !b.end_capture(s1).ok();
  MEMSIM_TRY(b.stream_wait(s1, s2));
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, b.end_capture(s1));
  return finish(b, {g});
}

// g1 frees its 64 MiB inside; g2 keeps a 64 MiB output. g2's output takes g1's pages; g1's
// next launch needs new ones.
inline Status remap_held(Backend& b, StreamId s, Observations& o) {
  DevPtr a = 0, out = 0;
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g1, one_alloc(b, s, 64 * kMiB, true, &a));
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g2, one_alloc(b, s, 64 * kMiB, false, &out));
  MEMSIM_TRY(b.launch(g1, s));
  o.reserved("held: g1");
  MEMSIM_TRY(b.launch(g2, s));
  o.reserved("held: g2 after g1");
  MEMSIM_TRY(b.launch(g1, s));
  o.reserved("held: g1 while g2's output is live");
  MEMSIM_TRY(b.free_async(out, s));
  MEMSIM_TRY(b.launch(g1, s));
  o.reserved("held: g1 after the output is freed");
  return finish(b, {g1, g2});
}

// cudaGraphUpload on s1 maps the graph; launching it on s1 or s2 keeps the mapping.
inline Status upload(Backend& b, StreamId s1, StreamId s2, Observations& o) {
  DevPtr a = 0;
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, one_alloc(b, s1, 256 * kMiB, true, &a));
  MEMSIM_TRY(b.upload(g, s1));
  o.reserved("upload");
  MEMSIM_TRY(b.launch(g, s2));
  MEMSIM_TRY(b.launch(g, s2));
  o.reserved("upload, then launches on another stream");
  return finish(b, {g});
}

// Every scenario, in order, as (name, run).
inline std::vector<std::pair<std::string, std::function<Status(Backend&, Observations&)>>>
all_scenarios(StreamId s1, StreamId s2) {
  using O = Observations;
  std::vector<std::pair<std::string, std::function<Status(Backend&, O&)>>> v = {
      {"auto_free", [=](Backend& b, O& o) { return auto_free(b, s1, o); }},
      {"layout", [=](Backend& b, O& o) { return layout(b, s1, o); }},
      {"two_streams", [=](Backend& b, O& o) { return two_streams(b, s1, s2, o); }},
      {"fork_join", [=](Backend& b, O& o) { return fork_join(b, s1, s2, o); }},
      {"unjoined", [=](Backend& b, O& o) { return unjoined(b, s1, s2, o); }},
      {"remap_held", [=](Backend& b, O& o) { return remap_held(b, s1, o); }},
      {"upload", [=](Backend& b, O& o) { return upload(b, s1, s2, o); }},
  };
  const std::pair<uint64_t, uint64_t> pairs[] = {{64 * kMiB, 64 * kMiB}, {64 * kMiB, 32 * kMiB},
                                                 {64 * kMiB, 96 * kMiB}, {3072, 2048},
                                                 {2048, 3072},           {3 * kMiB, 4 * kMiB},
                                                 {4 * kMiB, 3 * kMiB},   {2 * kMiB, 2 * kMiB + 1},
                                                 {40 * kMiB, 8 * kMiB}};
  for (const auto& pair : pairs)  // no structured binding: the lambda captures it
    v.emplace_back("reuse",
                   [=](Backend& b, O& o) { return reuse(b, s1, pair.first, pair.second, o); });
  return v;
}

}  // namespace memsim::graph_nodes
