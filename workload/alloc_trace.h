// Allocation traces: what a caller asked an allocator to do, in order (malloc, free,
// empty_cache), with the state when the trace began; built from a PyTorch memory snapshot or a
// generated program, replayed through any caching allocator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/result.h"

namespace memsim {

struct Snapshot;

struct TraceOp {
  enum class Kind : uint8_t { kAlloc, kFree, kEmptyCache };
  Kind kind = Kind::kAlloc;
  uint32_t stream = 0;  // dense stream index (0 = the default stream)
  uint32_t id = 0;      // the block: ids are dense, each allocated once (or held initially)
  uint64_t bytes = 0;   // kAlloc: the requested size
  int64_t time_us = 0;  // from the first recorded event
};

// A block live when the trace began, at `offset` in its segment. `size` is the block size the
// recording allocator gave it when the snapshot shows it (0 when only its request is known).
struct InitialBlock {
  uint64_t offset = 0;
  uint64_t requested = 0;
  uint64_t size = 0;
  uint32_t id = 0;
};

// A segment that existed when the trace began; the space between its live blocks was cached
// free memory.
struct InitialSegment {
  uint64_t size = 0;
  uint32_t stream = 0;
  bool small = false;                // PyTorch's small pool (2 MiB segments)
  std::vector<InitialBlock> blocks;  // by offset
};

struct AllocTrace {
  std::string source;  // file or generator, for reports
  std::vector<InitialSegment> initial;
  std::vector<TraceOp> ops;
  uint32_t blocks = 0;                         // ids in use: 0 .. blocks-1
  uint32_t streams = 1;                        // dense stream indices in use
  std::vector<uint64_t> stream_handles = {0};  // the recorded cudaStream_t of each index
  // From a snapshot only: the bytes the recording allocator had reserved when the trace began
  // and after each op (its segment_alloc/free/map/unmap events), and the OOMs it recorded.
  bool recorded = false;
  uint64_t recorded_initial_reserved = 0;
  std::vector<uint64_t> recorded_reserved;  // one per op
  uint64_t recorded_ooms = 0;
  bool recorded_expandable = false;  // the recording used expandable segments
  uint32_t graph_pool_segments = 0;  // segments of CUDA-graph private pools (replayed as default)
};

// Turns the device trace of `device` into an AllocTrace:
// - alloc -> kAlloc; free_completed -> kFree (the block is reusable from then on; a
//   free_requested only marks the caller's free, whose completion may wait for other streams);
// - a run of segment_free or segment_unmap events that leaves no fully free segment cached is an
//   empty_cache() (or the equivalent release after an OOM) -> kEmptyCache; a run that leaves
//   some is the allocator's own garbage collection, which the replayed allocator redoes itself;
// - the state when recording began is the dumped state walked back through the trace: segments
//   freed in the trace existed, segments allocated in it did not; blocks freed without an alloc
//   in the trace were live. Blocks still live at the end stay live (the caller holds them).
// Errors name `origin` and the trace entry.
Result<AllocTrace> trace_from_snapshot(const Snapshot& s, int device, const std::string& origin);

struct ShapeProgram;
// One captured graph's body from a trace (a snapshot recorded around one capture): a single graph
// "b<batch>.snapshot" whose tensors are the trace's blocks, freed ones intermediates, the ones
// still live at the end outputs. Memory live before the trace began (weights, static inputs)
// is not graph memory and is left out; empty_cache ops are dropped (torch.cuda.graph empties
// the cache before it captures) and streams merged.
ShapeProgram shape_program_from_trace(const AllocTrace& t, uint32_t batch);

// Checks ids and order: every kAlloc names a fresh id, every kFree a live one, sizes > 0, and
// recorded_reserved (when present) has one value per op. Empty string when valid.
std::string validate(const AllocTrace& t);

}  // namespace memsim
