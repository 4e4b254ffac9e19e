// Model of the driver's graph memory nodes (cudaMallocAsync captured into a graph): fixed VAs,
// physical pages attached at launch, reused across graphs launched into one stream.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"

namespace memsim {

// Model (after the CUDA programming guide's "Graph Memory Nodes" and measurements on H200):
// - Each graph allocation has its own VA, fixed at capture. The driver backs allocations with
//   whole pages (the VMM granularity) from its graph memory pool, so a graph needs
//   `peak` = the maximum over its body of the page-rounded bytes of simultaneously live
//   allocations (allocations with disjoint graph-ordered lifetimes share pages).
// - Allocations the graph does not free (outputs) stay live after the launch until freed outside,
//   freed by a later graph (a free node captured in another graph), or until the graph's next
//   launch (instantiated with AutoFreeOnLaunch).
// - Graphs launched into one stream never run concurrently, so they share that stream's backing:
//   backing[s] = max peak launched into s. Streams do not share. Launching g into s needs
//   g's peak + live outputs of other graphs + the backing of other streams; the pool
//   reservation is the maximum of that over launches and only shrinks on trim.
// - A graph's first launch (or first after a trim) maps its pages; launching a graph into a
//   different stream than last time remaps them.
class GraphMemoryModel {
 public:
  explicit GraphMemoryModel(uint64_t granularity) : granularity_(granularity) {}

  bool capturing(StreamId s) const { return captures_.count(s) != 0; }
  bool any_capturing() const { return !captures_.empty(); }
  Status begin(StreamId s);
  void add_node(StreamId s);
  void add_alloc(StreamId s, DevPtr va, uint64_t bytes);
  Status add_free(StreamId s, DevPtr va);
  struct Ended {
    uint64_t graph_id;
    uint64_t nodes;
  };
  Result<Ended> end(StreamId s);
  uint64_t nodes_in_capture(StreamId s) const;

  struct LaunchPlan {
    uint64_t reserved_after = 0;  // pool reservation once this launch has run
    uint64_t map_granules = 0;    // pages mapped for a first launch
    uint64_t remap_granules = 0;  // pages remapped for a change of stream
    uint64_t nodes = 0;
  };
  Result<LaunchPlan> plan_launch(uint64_t graph_id, StreamId s) const;
  void commit_launch(uint64_t graph_id, StreamId s, const LaunchPlan& plan);

  // A graph allocation freed outside any capture (cudaFreeAsync/cudaFree after a launch).
  bool is_graph_alloc(DevPtr va) const { return alloc_owner_.count(va) != 0; }
  // Frees a live output. Returns the VA to release when the allocation is finished with
  // (its graph destroyed), else nullopt.
  Result<std::optional<DevPtr>> free_outside(DevPtr va);
  // Destroys a graph; returns the VAs of its allocations that can be released now.
  Result<std::vector<DevPtr>> destroy(uint64_t graph_id);
  void trim();

  uint64_t reserved() const { return reserved_; }
  uint64_t used() const { return live_outputs_; }
  uint64_t graphs() const { return graphs_.size(); }
  // Allocations whose VA is still held (for teardown).
  std::vector<DevPtr> all_alloc_vas() const;

 private:
  struct Alloc {
    DevPtr va;
    uint64_t pages;  // page-rounded bytes
    bool freed_in_graph = false;
    bool live_outside = false;   // launched and not yet freed
    bool freed_outside = false;  // freed after a launch; VA waits for graph destroy
  };
  struct Graph {
    std::vector<Alloc> allocs;
    std::vector<DevPtr> frees_of_others;  // free nodes of other graphs' allocations
    uint64_t peak = 0;
    uint64_t nodes = 0;
    bool mapped = false;
    bool destroyed = false;
    std::optional<StreamId> last_stream;
  };
  struct Capture {
    Graph graph;
    uint64_t live = 0;
    std::unordered_map<DevPtr, size_t> index;  // va -> position in graph.allocs
  };
  uint64_t pages(uint64_t bytes) const {
    return (bytes + granularity_ - 1) / granularity_ * granularity_;
  }
  uint64_t live_bytes_of(const Graph& g) const;
  Alloc* find_alloc(DevPtr va, uint64_t* graph_id);

  uint64_t granularity_;
  std::map<StreamId, Capture> captures_;
  std::unordered_map<uint64_t, Graph> graphs_;
  std::unordered_map<DevPtr, uint64_t> alloc_owner_;  // va -> graph id (for ended captures)
  std::map<StreamId, uint64_t> backing_;
  uint64_t reserved_ = 0;
  uint64_t live_outputs_ = 0;
  uint64_t next_graph_ = 1;
};

}  // namespace memsim
