// Role interface of the caching-allocator family (torch_caching, ...) and of the segment
// sources they draw device memory from.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace memsim {

// Contract: hands out whole segments of device memory to a caching allocator.
// - allocate_segment(bytes) returns a range of at least `bytes` valid device addresses that no
//   other live segment of this source overlaps, or kOutOfMemory (with bytes_short) / another
//   error; on error nothing is held.
// - release_segment takes exactly a pointer and size previously returned and not yet released.
// - Implementations: device_malloc (cudaMalloc), the vmm_alias shared VMM space, ...
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  virtual Result<DevPtr> allocate_segment(uint64_t bytes, StreamId stream) = 0;
  virtual Status release_segment(DevPtr p, uint64_t bytes) = 0;
};

// Where a caller's tensors come from, one at a time (a graph-memory strategy behind the capture
// runner, lent to a model step captured into it).
class TensorAllocator {
 public:
  virtual ~TensorAllocator() = default;
  virtual Result<DevPtr> allocate(uint64_t bytes) = 0;
  virtual Status free(DevPtr p) = 0;
};

struct AllocatorStats {
  uint64_t reserved_bytes = 0;  // bytes of live segments (what the device sees)
  uint64_t peak_reserved_bytes = 0;
  uint64_t allocated_bytes = 0;  // bytes of live blocks (after rounding)
  uint64_t peak_allocated_bytes = 0;
  uint64_t requested_bytes = 0;  // bytes callers asked for, of live blocks
  uint64_t segments = 0;         // live segments
  uint64_t live_blocks = 0;
  uint64_t segment_allocs = 0;  // allocate_segment calls that succeeded, ever
  uint64_t segment_releases = 0;
  uint64_t ooms = 0;  // malloc calls that returned kOutOfMemory
};

struct LiveBlock {
  DevPtr ptr = 0;
  uint64_t size = 0;       // block size after rounding
  uint64_t requested = 0;  // size the caller asked for
};

// Helpers shared by the implementations.
// `blocks` sorted by address (live_blocks() returns them so).
inline std::vector<LiveBlock> by_address(std::vector<LiveBlock> blocks) {
  std::sort(blocks.begin(), blocks.end(),
            [](const LiveBlock& a, const LiveBlock& b) { return a.ptr < b.ptr; });
  return blocks;
}
// check_invariants(): records why and returns false.
inline bool invariant_broken(std::string* why, const std::string& msg) {
  if (why != nullptr) *why = msg;
  return false;
}
// After release_all(): nothing reserved, allocated or live (peaks and counts of calls stay).
inline void clear_current(AllocatorStats& s) {
  s.reserved_bytes = s.allocated_bytes = s.requested_bytes = 0;
  s.segments = s.live_blocks = 0;
}

// A segment that existed before a replayed trace began (from a memory snapshot): its size, the
// pool it belonged to, and the blocks live in it; the rest of it was cached free memory.
struct SegmentImage {
  struct Block {
    uint64_t offset = 0;
    uint64_t requested = 0;
    uint64_t size = 0;  // the recorded block size; 0 when only the request is known
  };
  uint64_t size = 0;
  StreamId stream;
  bool small = false;         // PyTorch's small pool
  std::vector<Block> blocks;  // by offset
};

// Told when a caching allocator takes or returns device memory (a segment), e.g. to record the
// allocator's timeline as a PyTorch snapshot.
class AllocatorObserver {
 public:
  virtual ~AllocatorObserver() = default;
  virtual void segment_alloc(DevPtr base, uint64_t bytes, StreamId stream) = 0;
  virtual void segment_free(DevPtr base, uint64_t bytes, StreamId stream) = 0;
  // Pages mapped into / unmapped from a segment that grows (expandable segments).
  virtual void segment_map(DevPtr, uint64_t, StreamId) {}
  virtual void segment_unmap(DevPtr, uint64_t, StreamId) {}
  // A caller's block (told by owners of allocators that route blocks, e.g. graph pools).
  virtual void block_alloc(DevPtr, uint64_t /*requested*/, StreamId) {}
  virtual void block_free(DevPtr) {}
};

// Contract: a device-memory caching allocator in the manner of PyTorch's
// CUDACachingAllocator.
// - malloc(bytes, stream) returns a pointer to >= bytes that overlaps no other live block;
//   bytes == 0 returns kInvalidArgument. Exhaustion of the segment source after releasing this
//   allocator's cached segments returns kOutOfMemory; the allocator stays usable.
// - free(p) takes a pointer returned by malloc and not yet freed (else kInvalidArgument); the
//   block becomes reusable by later malloc calls on the same stream.
// - empty_cache() returns every segment with no live block to the segment source.
// - release_all() frees every block and returns every segment (teardown); afterwards
//   stats().reserved_bytes == 0.
// - adopt_segment(image) takes over memory held before a trace began and returns one pointer
//   per image block, in order, as if malloc had returned them; allocators that keep PyTorch's
//   segment layout recreate the segment, the others (the default) malloc each block.
// - check_invariants() verifies internal consistency (blocks tile their segments, no overlap,
//   free blocks coalesced, byte counters equal to the sums they summarize).
class CachingAllocator {
 public:
  virtual ~CachingAllocator() = default;
  virtual Result<DevPtr> malloc(uint64_t bytes, StreamId stream) = 0;
  virtual Status free(DevPtr p) = 0;
  virtual Status empty_cache() = 0;
  virtual Status release_all() = 0;
  virtual Result<std::vector<DevPtr>> adopt_segment(const SegmentImage& image) {
    std::vector<DevPtr> out;
    for (const auto& b : image.blocks) {
      MEMSIM_ASSIGN_OR_RETURN(const DevPtr p, malloc(b.requested, image.stream));
      out.push_back(p);
    }
    return out;
  }
  virtual AllocatorStats stats() const = 0;
  virtual std::vector<LiveBlock> live_blocks() const = 0;
  virtual bool check_invariants(std::string* why) const = 0;

  // Segment events go to `observer` (nullptr: none) from now on.
  void set_observer(AllocatorObserver* observer) { observer_ = observer; }

 protected:
  AllocatorObserver* observer_ = nullptr;
};

}  // namespace memsim
