// Records a caching allocator's timeline (allocs, frees, segments) as a PyTorch memory snapshot,
// so memory_viz shows simulated memory like recorded memory.
#pragma once

#include <map>
#include <string>
#include <unordered_map>

#include "sim/workload/alloc_trace.h"
#include "sim/workload/snapshot.h"
#include "src/alloc/caching_allocator.h"
#include "src/alloc/registry.h"

namespace memsim {

struct GpuSpec;

// A CachingAllocator that forwards to `inner` and writes what happens as trace entries:
// malloc -> (segment_alloc...) alloc; free -> free_requested, free_completed; empty_cache ->
// segment_free...; adopted segments are recorded as segment_alloc + alloc. Time is the entry's
// index (memory_viz needs only the order). release_all() first takes the state at the end.
class RecordingAllocator final : public CachingAllocator, private AllocatorObserver {
 public:
  explicit RecordingAllocator(CachingAllocator& inner);
  ~RecordingAllocator() override;

  Result<DevPtr> malloc(uint64_t bytes, StreamId stream) override;
  Status free(DevPtr p) override;
  Status empty_cache() override;
  Status release_all() override;
  Result<std::vector<DevPtr>> adopt_segment(const SegmentImage& image) override;
  AllocatorStats stats() const override { return inner_.stats(); }
  std::vector<LiveBlock> live_blocks() const override { return inner_.live_blocks(); }
  bool check_invariants(std::string* why) const override { return inner_.check_invariants(why); }

  // The recorded snapshot: the trace so far, and the segments as they are now (or as they were
  // when release_all() was called).
  Snapshot snapshot() const;

 private:
  void segment_alloc(DevPtr base, uint64_t bytes, StreamId stream) override;
  void segment_free(DevPtr base, uint64_t bytes, StreamId stream) override;
  void segment_map(DevPtr base, uint64_t bytes, StreamId stream) override;
  void segment_unmap(DevPtr base, uint64_t bytes, StreamId stream) override;
  void add(TraceAction a, DevPtr addr, uint64_t size, StreamId stream);
  std::vector<SnapshotSegment> current_segments() const;

  CachingAllocator& inner_;
  std::vector<TraceEntry> trace_;
  std::map<DevPtr, std::pair<uint64_t, StreamId>> segments_;        // base -> (bytes, stream)
  std::unordered_map<DevPtr, std::pair<uint64_t, StreamId>> live_;  // ptr -> (requested, stream)
  std::vector<SnapshotSegment> final_segments_;
  bool finished_ = false;
};

// Replays `trace` through a fresh allocator from `factory` on a SimBackend built from `gpu`,
// recording it; returns the snapshot pickle.
Result<std::string> export_replay_snapshot(const AllocTrace& trace, const AllocatorFactory& factory,
                                           const GpuSpec& gpu);

}  // namespace memsim
