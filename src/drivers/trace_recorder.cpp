// TimelineRecorder, RecordingAllocator and the replay export.
#include "src/drivers/trace_recorder.h"

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "src/drivers/trace_replay.h"
#include "src/alloc/torch_caching.h"

namespace memsim {

void TimelineRecorder::add(TraceAction a, DevPtr addr, uint64_t size, StreamId stream) {
  TraceEntry e;
  e.action = a;
  e.addr = addr;
  e.size = size;
  e.stream = stream.id;
  e.time_us = static_cast<int64_t>(trace_.size());
  trace_.push_back(std::move(e));
}

void TimelineRecorder::segment_alloc(DevPtr base, uint64_t bytes, StreamId stream) {
  segments_[base] = {bytes, stream};
  add(TraceAction::kSegmentAlloc, base, bytes, stream);
}

void TimelineRecorder::segment_free(DevPtr base, uint64_t bytes, StreamId stream) {
  segments_.erase(base);
  add(TraceAction::kSegmentFree, base, bytes, stream);
}

// Expandable segments: only the events (the dumped state lists plain segments only).
void TimelineRecorder::segment_map(DevPtr base, uint64_t bytes, StreamId stream) {
  add(TraceAction::kSegmentMap, base, bytes, stream);
}

void TimelineRecorder::segment_unmap(DevPtr base, uint64_t bytes, StreamId stream) {
  add(TraceAction::kSegmentUnmap, base, bytes, stream);
}

void TimelineRecorder::block_alloc(DevPtr p, uint64_t requested, StreamId stream) {
  live_[p] = {requested, stream};
  add(TraceAction::kAlloc, p, requested, stream);
}

void TimelineRecorder::block_free(DevPtr p) {
  auto it = live_.find(p);
  if (it == live_.end()) return;
  add(TraceAction::kFreeRequested, p, it->second.first, it->second.second);
  add(TraceAction::kFreeCompleted, p, it->second.first, it->second.second);
  live_.erase(it);
}

// Segments with their live blocks and the free gaps between them.
Snapshot TimelineRecorder::snapshot(const std::vector<LiveBlock>* live) const {
  std::vector<LiveBlock> blocks;
  if (live != nullptr) {
    blocks = *live;
  } else {
    for (const auto& [p, info] : live_)
      blocks.push_back({p, (info.first + 511) / 512 * 512, info.first});
  }
  Snapshot s;
  auto b = blocks.begin();
  for (const auto& [base, info] : segments_) {
    SnapshotSegment seg;
    seg.address = base;
    seg.total_size = info.first;
    seg.stream = info.second.id;
    seg.small = info.first <= TorchCachingAllocator::kSmallBuffer;  // PyTorch's small pool
    DevPtr cursor = base;
    while (b != blocks.end() && b->ptr < base) ++b;
    for (; b != blocks.end() && b->ptr < base + info.first; ++b) {
      if (b->ptr > cursor)
        seg.blocks.push_back({cursor, b->ptr - cursor, 0, SnapshotBlock::State::kInactive, {}});
      const uint64_t size = std::min(b->size, base + info.first - b->ptr);
      seg.blocks.push_back(
          {b->ptr, size, b->requested, SnapshotBlock::State::kActiveAllocated, {}});
      cursor = b->ptr + size;
    }
    if (cursor < base + info.first)
      seg.blocks.push_back(
          {cursor, base + info.first - cursor, 0, SnapshotBlock::State::kInactive, {}});
    s.segments.push_back(std::move(seg));
  }
  s.device_traces.push_back(trace_);
  return s;
}

RecordingAllocator::RecordingAllocator(CachingAllocator& inner) : inner_(inner) {
  inner_.set_observer(&recorder_);
}

RecordingAllocator::~RecordingAllocator() {
  inner_.set_observer(nullptr);
}

Result<DevPtr> RecordingAllocator::malloc(uint64_t bytes, StreamId stream) {
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr p, inner_.malloc(bytes, stream));
  recorder_.block_alloc(p, bytes, stream);
  return p;
}

Status RecordingAllocator::free(DevPtr p) {
  MEMSIM_TRY(inner_.free(p));
  recorder_.block_free(p);
  return {};
}

Result<std::vector<DevPtr>> RecordingAllocator::adopt_segment(const SegmentImage& image) {
  MEMSIM_ASSIGN_OR_RETURN(std::vector<DevPtr> ptrs, inner_.adopt_segment(image));
  for (size_t k = 0; k < ptrs.size(); ++k)
    recorder_.block_alloc(ptrs[k], image.blocks[k].requested, image.stream);
  return ptrs;
}

Status RecordingAllocator::release_all() {
  if (!finished_) {
    final_live_ = inner_.live_blocks();
    finished_ = true;
  }
  inner_.set_observer(nullptr);  // teardown is not part of the recorded timeline
  return inner_.release_all();
}

Snapshot RecordingAllocator::snapshot() const {
  if (finished_) return recorder_.snapshot(&final_live_);
  const std::vector<LiveBlock> live = inner_.live_blocks();
  return recorder_.snapshot(&live);
}

Result<std::string> export_replay_snapshot(const AllocTrace& trace, const AllocatorFactory& factory,
                                           const GpuSpec& gpu) {
  SimClock clock;
  SimBackend backend(gpu, clock);
  auto inner = factory(backend);
  RecordingAllocator rec(*inner);
  ReplayOptions opt;
  opt.series = false;
  MEMSIM_ASSIGN_OR_RETURN(const ReplayOutcome outcome, replay_trace(trace, rec, backend, opt));
  (void)outcome;  // an OOM ends the recorded timeline where the replay stopped
  return serialize_snapshot(rec.snapshot());
}

}  // namespace memsim
