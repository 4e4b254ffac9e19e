// Role interface of the graph-memory family: where the tensors of captured CUDA graphs live.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "src/alloc/caching_allocator.h"

namespace memsim {

struct GraphInfo {
  uint32_t batch = 0;   // the batch shape the graph was captured for
  uint32_t runner = 0;  // which graph runner captures it (0 = full decode, 1 = piecewise)
  uint32_t piece = 0;   // index of the graph within its shape (piecewise graphs)
  std::string name;
};

struct GraphMemoryStats {
  uint64_t reserved_bytes = 0;  // physical bytes the strategy holds for graph memory
  uint64_t peak_reserved_bytes = 0;
  uint64_t allocated_bytes = 0;  // bytes of live tensors (after rounding)
  uint64_t pools = 0;            // caching-allocator pools, VA spaces or graphs it manages
  SimTime switch_time = 0;       // time spent preparing captures (vmm_alias: space switches)
};

// Contract (every implementation; the conformance suite checks it):
// - The runner calls begin_graph, then Backend::begin_capture on `stream`, then allocate/free
//   for the graph's body, then Backend::end_capture, then end_graph. Captures never nest.
// - allocate returns memory that overlaps no other allocation live in the same graph and, unless
//   the strategy aliases physical memory on purpose (vmm_alias, graph_mem_nodes), no allocation
//   of another graph that is still held. Failure is an error value (kOutOfMemory is reported by
//   the experiment as an outcome).
// - free may be called inside the capture (the tensor died inside the graph) or after it (a
//   graph output released by its holder); each pointer is freed at most once.
// - teardown (after the runner destroyed its graphs and freed everything it held) returns all
//   memory the strategy holds to the backend: afterwards stats().reserved_bytes == 0 and the
//   backend holds nothing on the strategy's behalf.
// - stats().reserved_bytes never exceeds the physical bytes the backend reports.
class GraphMemoryStrategy {
 public:
  virtual ~GraphMemoryStrategy() = default;
  virtual Status begin_graph(const GraphInfo& info, StreamId stream) = 0;
  virtual Result<DevPtr> allocate(uint64_t bytes, StreamId stream) = 0;
  virtual Status free(DevPtr p, StreamId stream) = 0;
  virtual Status end_graph() = 0;
  virtual Status teardown() = 0;
  virtual GraphMemoryStats stats() const = 0;
  virtual std::vector<LiveBlock> live_allocations() const = 0;
  virtual bool check_invariants(std::string* why) const = 0;
  // Whether a tensor kept alive past its graph (a strong output) keeps its contents while other
  // graphs run. False for strategies that alias other graphs' memory onto it (vmm_alias).
  virtual bool preserves_held_tensors() const { return true; }
  // Sends block and segment events to `observer` (to export the timeline as a PyTorch
  // snapshot). Returns false when the strategy has no caching allocator to observe.
  virtual bool set_observer(AllocatorObserver* /*observer*/) { return false; }
};

}  // namespace memsim
