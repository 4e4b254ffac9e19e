// Model of the driver's graph memory nodes (cudaMallocAsync captured into a graph): fixed VAs,
// physical pages attached at launch, reused across graphs launched into one stream.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"

namespace memsim {

// Model (after the CUDA programming guide's "Graph Memory Nodes" and measurements on H200):
// - Each graph allocation has its own VA, fixed at capture. Within a graph the driver lays out
//   its allocations (rounded to whole pages) in an arena that grows by chunks: a request no
//   free range fits gets a new chunk of round_up(request, chunk) bytes; freed ranges are reused
//   best-fit, split, and merged with free neighbours (chunks are contiguous, so free space of
//   adjacent chunks merges); a new chunk is sized for the whole request, never used to extend a
//   free tail. A graph needs `peak` = its arena's size. (Probed on H200, driver 580, with
//   memsim-graphmem-probe: 32 MiB chunks; 100 MiB freed then 200 MiB -> 352 MiB; two adjacent
//   freed 100 MiB then 200 MiB -> 256 MiB; 1 KiB -> 32 MiB.)
// - Allocations the graph does not free (outputs) stay live after the launch until freed outside,
//   freed by a later graph (a free node captured in another graph), or until the graph's next
//   launch (instantiated with AutoFreeOnLaunch).
// - Graphs launched into one stream never run concurrently, so they share that stream's backing:
//   the pool must hold the largest peak launched so far. Streams share the pool too: on H200
//   a 256 MiB graph launched alternately into two streams keeps 256 MiB reserved (memsim
//   calibrate). Launching g needs g's peak + the live outputs of other graphs; the pool
//   reservation is the maximum of that over launches and only shrinks on trim.
// - A graph's first launch (or first after a trim) maps its pages; launching a graph into a
//   different stream than last time remaps them. Its first launch also uploads it (every graph,
//   memory nodes or not).
class GraphMemoryModel {
 public:
  // `chunk`: the arena growth unit (0 = the granularity).
  GraphMemoryModel(uint64_t granularity, uint64_t chunk)
      : granularity_(granularity), chunk_(chunk ? chunk : granularity) {}

  bool capturing(StreamId s) const { return captures_.count(s) != 0; }
  bool any_capturing() const { return !captures_.empty(); }
  Status begin(StreamId s);
  void add_node(StreamId s, uint64_t n = 1);
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
    uint64_t upload_nodes = 0;  // first launch: the nodes that are not memory nodes
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
    uint64_t mem_nodes = 0;  // alloc and free nodes (of its own or other graphs' allocations)
    bool uploaded = false;   // launched once (a trim unmaps its pages, it stays uploaded)
    bool mapped = false;
    bool destroyed = false;
    std::optional<StreamId> last_stream;
  };
  // Best-fit arena of one capture; offsets are arena addresses, chunks laid end to end.
  class Arena {
   public:
    explicit Arena(uint64_t chunk) : chunk_(chunk) {}
    uint64_t alloc(uint64_t size);
    void free(uint64_t offset);
    uint64_t size() const { return size_; }

   private:
    struct Block {
      uint64_t size;
      bool free;
    };
    uint64_t chunk_;
    uint64_t size_ = 0;
    uint64_t next_base_ = 0;
    std::map<uint64_t, Block> blocks_;              // offset -> block
    std::set<std::pair<uint64_t, uint64_t>> free_;  // (size, offset)
  };
  struct Capture {
    explicit Capture(uint64_t chunk) : arena(chunk) {}
    Graph graph;
    Arena arena;
    std::unordered_map<DevPtr, size_t> index;   // va -> position in graph.allocs
    std::unordered_map<DevPtr, uint64_t> slot;  // va -> arena offset
  };
  uint64_t pages(uint64_t bytes) const {
    return (bytes + granularity_ - 1) / granularity_ * granularity_;
  }
  uint64_t live_bytes_of(const Graph& g) const;
  Alloc* find_alloc(DevPtr va, uint64_t* graph_id);

  uint64_t granularity_;
  uint64_t chunk_;
  std::map<StreamId, Capture> captures_;
  std::unordered_map<uint64_t, Graph> graphs_;
  std::unordered_map<DevPtr, uint64_t> alloc_owner_;  // va -> graph id (for ended captures)

  uint64_t reserved_ = 0;
  uint64_t live_outputs_ = 0;
  uint64_t next_graph_ = 1;
};

}  // namespace memsim
