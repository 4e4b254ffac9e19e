// Records a caching allocator's timeline (allocs, frees, segments) as a PyTorch memory snapshot,
// so memory_viz shows simulated memory like recorded memory.
#pragma once

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "workload/alloc_trace.h"
#include "workload/snapshot.h"
#include "src/alloc/caching_allocator.h"
#include "src/alloc/registry.h"

namespace memsim {

struct GpuSpec;

// An observer that writes every event as a trace entry: block_alloc -> alloc, block_free ->
// free_requested + free_completed, segment events as they are. Time is the entry's index
// (memory_viz needs only the order).
class TimelineRecorder final : public AllocatorObserver {
 public:
  void segment_alloc(DevPtr base, uint64_t bytes, StreamId stream) override;
  void segment_free(DevPtr base, uint64_t bytes, StreamId stream) override;
  void segment_map(DevPtr base, uint64_t bytes, StreamId stream) override;
  void segment_unmap(DevPtr base, uint64_t bytes, StreamId stream) override;
  void block_alloc(DevPtr p, uint64_t requested, StreamId stream) override;
  void block_free(DevPtr p) override;

  // The trace so far and the segments now, their blocks from `live` (exact sizes, by address)
  // or, without it, from the recorded requests rounded to 512 B.
  Snapshot snapshot(const std::vector<LiveBlock>* live = nullptr) const;

 private:
  void add(TraceAction a, DevPtr addr, uint64_t size, StreamId stream);

  std::vector<TraceEntry> trace_;
  std::map<DevPtr, std::pair<uint64_t, StreamId>> segments_;  // base -> (bytes, stream)
  std::map<DevPtr, std::pair<uint64_t, StreamId>> live_;      // ptr -> (requested, stream)
};

// A CachingAllocator that forwards to `inner` and records what happens (adopted segments are
// recorded as segment_alloc + alloc). release_all() first takes the state at the end.
class RecordingAllocator final : public CachingAllocator {
 public:
  explicit RecordingAllocator(CachingAllocator& inner);
  ~RecordingAllocator() override;

  Result<DevPtr> malloc(uint64_t bytes, StreamId stream) override;
  Status free(DevPtr p) override;
  Status empty_cache() override { return inner_.empty_cache(); }
  Status release_all() override;
  Result<std::vector<DevPtr>> adopt_segment(const SegmentImage& image) override;
  AllocatorStats stats() const override { return inner_.stats(); }
  std::vector<LiveBlock> live_blocks() const override { return inner_.live_blocks(); }
  bool check_invariants(std::string* why) const override { return inner_.check_invariants(why); }

  Snapshot snapshot() const;

 private:
  CachingAllocator& inner_;
  TimelineRecorder recorder_;
  std::vector<LiveBlock> final_live_;
  bool finished_ = false;
};

// Replays `trace` through a fresh allocator from `factory` on a SimBackend built from `gpu`,
// recording it; returns the snapshot pickle.
Result<std::string> export_replay_snapshot(const AllocTrace& trace, const AllocatorFactory& factory,
                                           const GpuSpec& gpu);

}  // namespace memsim
