// Model of the driver's graph memory nodes (cudaMallocAsync captured into a graph): fixed VAs,
// physical pages attached at launch, reused across graphs launched into one stream.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/backend.h"

namespace memsim {

// Model (after the CUDA programming guide's "Graph Memory Nodes" and measurements on H200 with
// tools/repro/graph_node_semantics.cu and memsim-graphmem-probe, driver 580):
// - Addresses. Each graph has its own VA window. Inside it the driver places allocations in
//   512-byte units, best fit over the addresses freed earlier in the graph (split, merged with
//   free neighbours), else after the last one: a later allocation gets a freed one's address when
//   it fits (3 KiB freed, then 2 KiB: same address; 2 KiB freed, then 3 KiB: 2 KiB further on).
// - Physical memory. A graph needs `peak` = the size of an arena laid out like the addresses but
//   in whole pages that grows by chunks: a request no free range fits gets a new chunk of
//   round_up(request, chunk) bytes, merged with a free tail of the previous one (32 MiB chunks;
//   100 MiB freed then 200 MiB -> 352 MiB; 1 KiB -> 32 MiB).
// - Ordering inside a capture. A stream that waits on a capturing stream joins its capture (fork);
//   the capture ends only when the origin has waited on every joined stream since its last work
//   (join). An address or page freed on one stream is reused only by work ordered after the free:
//   two branches of a fork never share (64 MiB in each: 128 MiB, different addresses).
// - Outputs (allocations the graph does not free) stay live after the launch until freed outside,
//   by another graph's free node, or by the graph's next launch. A graph instantiated without
//   AutoFreeOnLaunch refuses to launch while it has live outputs (cudaErrorInvalidValue).
// - Sharing between graphs. Graphs share one physical pool; a launch needs the graph's peak, the
//   live outputs of the others, and the pages of graphs still running on other streams: 256 +
//   256 MiB graphs launched back to back into two streams hold 512 MiB, one after the other
//   256 MiB. The driver looks at whether the other graph still executes, not at events: ordered
//   after it by an event while it runs, the launch still takes 512 MiB; finished but never
//   synchronized, 256 MiB. The sim has no GPU timeline here, so a graph launched on another
//   stream counts as running until synchronize() (or a device_free or host_free_pinned, which
//   wait for the device as cudaFree does): exact for programs that synchronize or launch
//   back to back, more than the driver's when a graph finished unobserved. The pool keeps its
//   largest size until a trim.
// - Mapping. A graph's first launch or upload (or first after a trim) maps its pages; when a
//   launch must grow the pool while the graph is mapped, another graph's live output or a
//   concurrent graph holds its pages and it is remapped (64 MiB: 147 us against 9 us). Launching
//   into another idle stream does not remap (11.3 against 10.7 us). The first launch or upload
//   also uploads the graph's other nodes.
class GraphMemoryModel {
 public:
  static constexpr uint64_t kAddressUnit = 512;  // graph allocations' VA alignment (H200)

  // `chunk`: the physical arena's growth unit (0 = the granularity).
  GraphMemoryModel(uint64_t granularity, uint64_t chunk)
      : granularity_(granularity), chunk_(chunk ? chunk : granularity) {}

  // A stream capturing: the origin of a capture or a stream joined to it.
  bool capturing(StreamId s) const { return member_of_.count(s) != 0; }
  bool any_capturing() const { return !captures_.empty(); }
  // The stream whose capture `s` belongs to (s itself for an origin); s must be capturing.
  StreamId origin_of(StreamId s) const { return member_of_.at(s); }
  // Starts a capture on `s`; its allocations get addresses in [window, window + window_bytes).
  Status begin(StreamId s, DevPtr window, uint64_t window_bytes);
  // `waiter` waits on the work enqueued on `on` so far (an event). Inside a capture it forks
  // `waiter` into `on`'s capture or joins it back; outside, graph memory ignores it.
  Status stream_wait(StreamId waiter, StreamId on);
  // The host waited for the device: no launched graph runs any more.
  void synchronize() { running_.clear(); }
  void add_node(StreamId s, uint64_t n = 1);
  // A graph allocation of `bytes` on capturing stream `s`: its address, or kOutOfMemory when
  // the window is full.
  Result<DevPtr> add_alloc(StreamId s, uint64_t bytes);
  Status add_free(StreamId s, DevPtr va);
  struct Ended {
    uint64_t graph_id;
    uint64_t nodes;
    DevPtr window;
    uint64_t extent;  // bytes of the window in use (0: no allocation; the window is unused)
  };
  // Ends the capture whose origin is `s`.
  Result<Ended> end(StreamId s, bool auto_free_on_launch);
  uint64_t nodes_in_capture(StreamId s) const;

  struct LaunchPlan {
    uint64_t reserved_after = 0;  // pool reservation once this launch has run
    uint64_t map_granules = 0;    // pages mapped for a first launch or upload
    uint64_t remap_granules = 0;  // pages remapped because others hold the graph's pages
    uint64_t nodes = 0;
    uint64_t upload_nodes = 0;  // first launch or upload: the nodes that are not memory nodes
    bool upload_only = false;   // cudaGraphUpload: maps and uploads, runs nothing
  };
  Result<LaunchPlan> plan_launch(uint64_t graph_id, StreamId s, bool upload_only = false) const;
  // Returns the windows of destroyed graphs whose last output this launch freed (to release).
  std::vector<DevPtr> commit_launch(uint64_t graph_id, StreamId s, const LaunchPlan& plan);

  // A graph allocation freed outside any capture (cudaFreeAsync/cudaFree after a launch).
  bool is_graph_alloc(DevPtr va) const;
  // Frees a live output. Returns the window to release when its graph is finished with
  // (destroyed, no live output left), else nullopt.
  Result<std::optional<DevPtr>> free_outside(DevPtr va);
  // Destroys a graph; returns its window when it can be released now.
  Result<std::optional<DevPtr>> destroy(uint64_t graph_id);
  void trim();

  uint64_t reserved() const { return reserved_; }
  uint64_t used() const { return live_outputs_; }
  uint64_t graphs() const { return graphs_.size(); }
  // Windows still held (for teardown and the backend's VA accounting): base -> bytes in use.
  const std::map<DevPtr, uint64_t>& windows() const { return windows_; }

 private:
  struct Alloc {
    DevPtr va;
    uint64_t pages;  // page-rounded bytes
    bool freed_in_graph = false;
    bool live_outside = false;  // launched and not yet freed
  };
  struct Graph {
    std::vector<Alloc> allocs;
    std::unordered_map<DevPtr, size_t> outputs;  // va -> allocs index, for allocations not freed
    std::vector<DevPtr> frees_of_others;         // free nodes of other graphs' allocations
    DevPtr window = 0;
    uint64_t peak = 0;
    uint64_t nodes = 0;
    uint64_t mem_nodes = 0;  // alloc and free nodes (of its own or other graphs' allocations)
    bool auto_free = true;   // instantiated with AutoFreeOnLaunch
    bool uploaded = false;   // launched or uploaded once (a trim unmaps its pages, not this)
    bool mapped = false;
    bool destroyed = false;
  };
  // Happens-before inside a capture: per stream, the last event of each stream it is ordered
  // after (a vector clock). A freed range carries the clock entries of its frees.
  using Clock = std::map<StreamId, uint64_t>;
  using Stamps = std::vector<std::pair<StreamId, uint64_t>>;
  // Best-fit arena of one capture (addresses or pages); offsets from 0, laid end to end.
  class Arena {
   public:
    // `unit`: sizes are rounded up to it; `chunk`: growth unit; `merge_tail`: a new chunk merges
    // with a free range at the end (the physical arena) or is placed after it (addresses).
    Arena(uint64_t unit, uint64_t chunk, bool merge_tail)
        : unit_(unit), chunk_(chunk), merge_tail_(merge_tail) {}
    uint64_t alloc(uint64_t size, const Clock& seen);
    void free(uint64_t offset, const Stamps& stamps);
    uint64_t size() const { return size_; }

   private:
    struct Block {
      uint64_t size;
      bool free;
      Stamps stamps;  // the frees that made it free (empty: never allocated)
    };
    static bool visible(const Stamps& stamps, const Clock& seen);
    static bool same_streams(const Stamps& a, const Stamps& b);
    static void absorb(Block& into, const Block& from);  // `from` follows `into`
    // Merges adjacent free ranges that `seen` may all reuse; whether any merged.
    bool coalesce_visible(const Clock& seen);
    uint64_t unit_, chunk_;
    bool merge_tail_;
    uint64_t size_ = 0;
    std::map<uint64_t, Block> blocks_;              // offset -> block
    std::set<std::pair<uint64_t, uint64_t>> free_;  // (size, offset)
  };
  struct Capture {
    Capture(uint64_t granularity, uint64_t chunk, DevPtr window, uint64_t window_bytes)
        : pages(granularity, chunk, true),
          addresses(kAddressUnit, kAddressUnit, false),
          window(window),
          window_bytes(window_bytes) {}
    Graph graph;
    Arena pages, addresses;
    DevPtr window;
    uint64_t window_bytes;
    std::map<StreamId, Clock> clocks;                // every stream of the capture
    std::unordered_map<DevPtr, size_t> live;         // va -> allocs index, not yet freed
    std::unordered_map<DevPtr, uint64_t> page_slot;  // va -> page arena offset (live ones)
  };
  uint64_t pages(uint64_t bytes) const {
    return (bytes + granularity_ - 1) / granularity_ * granularity_;
  }
  uint64_t live_bytes_of(const Graph& g) const;
  uint64_t tick(Capture& c, StreamId s) { return ++c.clocks[s][s]; }
  Capture& capture_of(StreamId s) { return captures_.at(member_of_.at(s)); }
  // The graph id and allocs index of the output at `va` (an allocation its graph does not free).
  std::optional<std::pair<uint64_t, size_t>> output_at(DevPtr va) const;
  // Erases a graph and its window's entries; returns the window to release, if it kept one.
  std::optional<DevPtr> drop_graph(uint64_t graph_id);

  uint64_t granularity_;
  uint64_t chunk_;
  std::map<StreamId, Capture> captures_;    // by origin stream
  std::map<StreamId, StreamId> member_of_;  // capturing stream -> origin
  std::unordered_map<uint64_t, Graph> graphs_;
  std::map<DevPtr, uint64_t> window_owner_;  // window base -> graph id (ended captures)
  std::map<DevPtr, uint64_t> windows_;       // window base -> bytes (ended captures)

  // Graphs launched since the last synchronize() (they may still run), by stream: a launch
  // looks only at the other streams' (none in a one-stream program).
  std::map<StreamId, std::unordered_set<uint64_t>> running_;

  uint64_t reserved_ = 0;
  uint64_t live_outputs_ = 0;
  uint64_t next_graph_ = 1;
};

}  // namespace memsim
