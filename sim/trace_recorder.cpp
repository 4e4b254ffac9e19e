// RecordingAllocator and the replay export.
#include "sim/trace_recorder.h"

#include "backends/sim/sim_backend.h"
#include "sim/clock.h"
#include "sim/trace_replay.h"

namespace memsim {

namespace {
constexpr uint64_t kSmallSegmentBytes = 2ull << 20;  // PyTorch's small-pool segment size
}

RecordingAllocator::RecordingAllocator(CachingAllocator& inner) : inner_(inner) {
  inner_.set_observer(this);
}

RecordingAllocator::~RecordingAllocator() {
  inner_.set_observer(nullptr);
}

void RecordingAllocator::add(TraceAction a, DevPtr addr, uint64_t size, StreamId stream) {
  TraceEntry e;
  e.action = a;
  e.addr = addr;
  e.size = size;
  e.stream = stream.id;
  e.time_us = static_cast<int64_t>(trace_.size());
  trace_.push_back(std::move(e));
}

void RecordingAllocator::segment_alloc(DevPtr base, uint64_t bytes, StreamId stream) {
  segments_[base] = {bytes, stream};
  add(TraceAction::kSegmentAlloc, base, bytes, stream);
}

void RecordingAllocator::segment_free(DevPtr base, uint64_t bytes, StreamId stream) {
  segments_.erase(base);
  add(TraceAction::kSegmentFree, base, bytes, stream);
}

// Expandable segments: only the events (the dumped state lists plain segments only).
void RecordingAllocator::segment_map(DevPtr base, uint64_t bytes, StreamId stream) {
  add(TraceAction::kSegmentMap, base, bytes, stream);
}

void RecordingAllocator::segment_unmap(DevPtr base, uint64_t bytes, StreamId stream) {
  add(TraceAction::kSegmentUnmap, base, bytes, stream);
}

Result<DevPtr> RecordingAllocator::malloc(uint64_t bytes, StreamId stream) {
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr p, inner_.malloc(bytes, stream));
  live_[p] = {bytes, stream};
  add(TraceAction::kAlloc, p, bytes, stream);
  return p;
}

Status RecordingAllocator::free(DevPtr p) {
  auto it = live_.find(p);
  MEMSIM_TRY(inner_.free(p));
  if (it != live_.end()) {
    add(TraceAction::kFreeRequested, p, it->second.first, it->second.second);
    add(TraceAction::kFreeCompleted, p, it->second.first, it->second.second);
    live_.erase(it);
  }
  return {};
}

Status RecordingAllocator::empty_cache() {
  return inner_.empty_cache();
}

Result<std::vector<DevPtr>> RecordingAllocator::adopt_segment(const SegmentImage& image) {
  MEMSIM_ASSIGN_OR_RETURN(std::vector<DevPtr> ptrs, inner_.adopt_segment(image));
  for (size_t k = 0; k < ptrs.size(); ++k) {
    live_[ptrs[k]] = {image.blocks[k].requested, image.stream};
    add(TraceAction::kAlloc, ptrs[k], image.blocks[k].requested, image.stream);
  }
  return ptrs;
}

Status RecordingAllocator::release_all() {
  if (!finished_) {
    final_segments_ = current_segments();
    finished_ = true;
  }
  inner_.set_observer(nullptr);  // teardown is not part of the recorded timeline
  return inner_.release_all();
}

// Segments with their live blocks (from the allocator) and the free gaps between them.
std::vector<SnapshotSegment> RecordingAllocator::current_segments() const {
  std::vector<SnapshotSegment> out;
  const std::vector<LiveBlock> blocks = inner_.live_blocks();  // by address
  auto b = blocks.begin();
  for (const auto& [base, info] : segments_) {
    SnapshotSegment seg;
    seg.address = base;
    seg.total_size = info.first;
    seg.stream = info.second.id;
    seg.small = info.first <= kSmallSegmentBytes;
    DevPtr cursor = base;
    while (b != blocks.end() && b->ptr < base) ++b;
    for (; b != blocks.end() && b->ptr < base + info.first; ++b) {
      if (b->ptr > cursor)
        seg.blocks.push_back({cursor, b->ptr - cursor, 0, SnapshotBlock::State::kInactive, {}});
      seg.blocks.push_back(
          {b->ptr, b->size, b->requested, SnapshotBlock::State::kActiveAllocated, {}});
      cursor = b->ptr + b->size;
    }
    if (cursor < base + info.first)
      seg.blocks.push_back(
          {cursor, base + info.first - cursor, 0, SnapshotBlock::State::kInactive, {}});
    out.push_back(std::move(seg));
  }
  return out;
}

Snapshot RecordingAllocator::snapshot() const {
  Snapshot s;
  s.segments = finished_ ? final_segments_ : current_segments();
  s.device_traces.push_back(trace_);
  return s;
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
