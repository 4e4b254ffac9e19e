// Snapshot -> AllocTrace: the initial state walked back from the dump, then the trace forward.
#include "workload/alloc_trace.h"

#include <iterator>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "workload/alloc_program.h"
#include "workload/snapshot.h"

namespace memsim {

namespace {

// PyTorch's small segments are kSmallBuffer (2 MiB, c10/cuda/CUDACachingAllocator.cpp; the
// same constant as TorchCachingAllocator::kSmallBuffer); large ones are at least 10 MiB.
constexpr uint64_t kPyTorchSmallBuffer = 2ull << 20;
bool is_small_segment(uint64_t bytes) {
  return bytes <= kPyTorchSmallBuffer;
}

struct SegState {
  uint64_t size = 0;
  uint64_t stream = 0;
  bool small = false;
  uint32_t live = 0;  // live blocks (allocated, or freed but not yet completed)
};

class Builder {
 public:
  Builder(const Snapshot& s, int device, std::string origin)
      : snap_(s), device_(device), origin_(std::move(origin)) {}

  Result<AllocTrace> build();

 private:
  Error fail(size_t entry, const std::string& what) const {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: device_traces[{}][{}]: {}", origin_, device_, entry, what));
  }
  uint32_t stream_index(uint64_t raw) {
    auto [it, fresh] = streams_.emplace(raw, static_cast<uint32_t>(t_.stream_handles.size()));
    if (fresh) t_.stream_handles.push_back(raw);
    return it->second;
  }
  // The segment holding `addr`, or end().
  std::map<uint64_t, SegState>::iterator segment_of(uint64_t addr) {
    auto it = segs_.upper_bound(addr);
    if (it == segs_.begin()) return segs_.end();
    --it;
    return addr < it->first + it->second.size ? it : segs_.end();
  }
  void add_live(uint64_t addr) {
    auto s = segment_of(addr);
    if (s != segs_.end() && s->second.live++ == 0) --free_segments_;
  }
  void drop_live(uint64_t addr) {
    auto s = segment_of(addr);
    if (s != segs_.end() && --s->second.live == 0) ++free_segments_;
  }
  Status initial_state(const std::vector<TraceEntry>& trace);
  Status forward(const std::vector<TraceEntry>& trace);

  const Snapshot& snap_;
  const int device_;
  const std::string origin_;
  AllocTrace t_;
  std::unordered_map<uint64_t, uint32_t> streams_ = {{0, 0}};
  std::map<uint64_t, SegState> segs_;            // recorded segments (non-expandable)
  uint64_t free_segments_ = 0;                   // of those, with no live block
  std::unordered_map<uint64_t, uint32_t> live_;  // recorded address -> block id
};

// Walks the trace backwards from the dumped state to the state when recording began.
Status Builder::initial_state(const std::vector<TraceEntry>& trace) {
  struct Live {
    uint64_t requested = 0, size = 0;
  };
  std::map<uint64_t, SegState> segs;
  std::map<uint64_t, Live> live;
  for (const auto& seg : snap_.segments) {
    if (seg.device != device_) continue;
    if (seg.pool_id[0] != 0 || seg.pool_id[1] != 0) ++t_.graph_pool_segments;
    if (seg.expandable) {
      t_.recorded_expandable = true;
      t_.recorded_initial_reserved += seg.total_size;  // walked back below with map/unmap
      for (const auto& b : seg.blocks)
        if (b.state != SnapshotBlock::State::kInactive) live[b.address] = {b.requested_size, 0};
      continue;
    }
    segs[seg.address] = SegState{seg.total_size, seg.stream, seg.small, 0};
    for (const auto& b : seg.blocks)
      if (b.state != SnapshotBlock::State::kInactive) live[b.address] = {b.requested_size, b.size};
  }
  for (auto it = trace.rbegin(); it != trace.rend(); ++it) {
    const TraceEntry& e = *it;
    switch (e.action) {
      case TraceAction::kAlloc:
        live.erase(e.addr);
        break;
      case TraceAction::kFreeCompleted:
        live[e.addr] = {e.size, 0};
        break;
      case TraceAction::kSegmentAlloc:
        segs.erase(e.addr);
        break;
      case TraceAction::kSegmentFree:
        segs[e.addr] = SegState{e.size, e.stream, is_small_segment(e.size), 0};
        break;
      case TraceAction::kSegmentMap:
        t_.recorded_expandable = true;
        t_.recorded_initial_reserved -= std::min(t_.recorded_initial_reserved, e.size);
        break;
      case TraceAction::kSegmentUnmap:
        t_.recorded_expandable = true;
        t_.recorded_initial_reserved += e.size;
        break;
      default:
        break;
    }
  }
  if (t_.recorded_expandable && !live.empty())
    return make_error(ErrorCode::kNotSupported,
                      origin_ +
                          ": blocks were live in expandable segments when recording "
                          "began; memsim replays expandable-segment snapshots only when "
                          "recording started before the first allocation");
  // Lay the initial live blocks into their segments.
  for (auto& [addr, seg] : segs) {
    InitialSegment is;
    is.size = seg.size;
    is.stream = stream_index(seg.stream);
    is.small = seg.small;
    for (auto b = live.lower_bound(addr); b != live.end() && b->first < addr + seg.size;) {
      InitialBlock ib{b->first - addr, b->second.requested, b->second.size, t_.blocks++};
      live_[b->first] = ib.id;
      is.blocks.push_back(ib);
      b = live.erase(b);
    }
    t_.recorded_initial_reserved += seg.size;
    t_.initial.push_back(std::move(is));
  }
  if (!live.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: the block at {:#x} was live when recording began but lies "
                                  "in no segment of device {}: the snapshot is inconsistent",
                                  origin_, live.begin()->first, device_));
  segs_ = std::move(segs);
  free_segments_ = segs_.size();
  for (const auto& [addr, id] : live_) add_live(addr);
  return {};
}

Status Builder::forward(const std::vector<TraceEntry>& trace) {
  const int64_t t0 = trace.empty() ? 0 : trace.front().time_us;
  uint64_t reserved = t_.recorded_initial_reserved;
  bool in_release = false;  // inside a run of segment_free / segment_unmap events
  bool release_unmaps = false;
  int64_t release_time = 0;
  auto emit = [&](TraceOp op) {
    t_.ops.push_back(op);
    t_.recorded_reserved.push_back(reserved);
  };
  // A release run that leaves no fully free segment cached was an empty_cache.
  auto end_release = [&]() {
    if (!in_release) return;
    in_release = false;
    if (release_unmaps || free_segments_ == 0) {
      TraceOp op;
      op.kind = TraceOp::Kind::kEmptyCache;
      op.time_us = release_time;
      emit(op);
    }  // else garbage collection inside the next malloc: its reserved figure includes it
  };
  for (size_t k = 0; k < trace.size(); ++k) {
    const TraceEntry& e = trace[k];
    const bool release =
        e.action == TraceAction::kSegmentFree || e.action == TraceAction::kSegmentUnmap;
    if (!release) end_release();
    const int64_t time = e.time_us - t0;
    switch (e.action) {
      case TraceAction::kAlloc: {
        if (e.size == 0) return fail(k, "alloc of 0 bytes");
        if (live_.count(e.addr) != 0)
          return fail(k, fmt::format("alloc at {:#x}, which is already live", e.addr));
        TraceOp op;
        op.kind = TraceOp::Kind::kAlloc;
        op.stream = stream_index(e.stream);
        op.id = t_.blocks++;
        op.bytes = e.size;
        op.time_us = time;
        live_[e.addr] = op.id;
        add_live(e.addr);
        emit(op);
        break;
      }
      case TraceAction::kFreeCompleted: {
        auto it = live_.find(e.addr);
        if (it == live_.end())
          return fail(k, fmt::format("free_completed at {:#x}, which no alloc or initial block "
                                     "holds",
                                     e.addr));
        TraceOp op;
        op.kind = TraceOp::Kind::kFree;
        op.stream = stream_index(e.stream);
        op.id = it->second;
        op.time_us = time;
        live_.erase(it);
        drop_live(e.addr);
        emit(op);
        break;
      }
      case TraceAction::kSegmentAlloc:
        reserved += e.size;
        if (segs_.count(e.addr) != 0)
          return fail(k, fmt::format("segment_alloc at {:#x}, which is already a segment", e.addr));
        segs_[e.addr] = SegState{e.size, e.stream, is_small_segment(e.size), 0};
        ++free_segments_;
        break;
      case TraceAction::kSegmentFree: {
        auto it = segs_.find(e.addr);
        if (it == segs_.end())
          return fail(k, fmt::format("segment_free at {:#x}, which is no segment", e.addr));
        if (it->second.live != 0)
          return fail(k, fmt::format("segment_free at {:#x} while {} of its blocks are live",
                                     e.addr, it->second.live));
        reserved -= std::min(reserved, it->second.size);
        segs_.erase(it);
        --free_segments_;
        if (!in_release) release_time = time;
        in_release = true;
        break;
      }
      case TraceAction::kSegmentMap:
        reserved += e.size;
        break;
      case TraceAction::kSegmentUnmap:
        reserved -= std::min(reserved, e.size);
        if (!in_release) release_time = time;
        in_release = true;
        release_unmaps = true;
        break;
      case TraceAction::kOom:
        ++t_.recorded_ooms;
        break;
      case TraceAction::kFreeRequested:
      case TraceAction::kSnapshot:
        break;
    }
    if (!release) release_unmaps = false;
  }
  end_release();
  return {};
}

Result<AllocTrace> Builder::build() {
  if (device_ < 0 || static_cast<size_t>(device_) >= snap_.device_traces.size())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: no trace for device {} (the snapshot has {})", origin_,
                                  device_, snap_.device_traces.size()));
  const auto& trace = snap_.device_traces[static_cast<size_t>(device_)];
  t_.source = origin_;
  t_.recorded = true;
  MEMSIM_TRY(initial_state(trace));
  MEMSIM_TRY(forward(trace));
  t_.streams = static_cast<uint32_t>(t_.stream_handles.size());
  return std::move(t_);
}

}  // namespace

Result<AllocTrace> trace_from_snapshot(const Snapshot& s, int device, const std::string& origin) {
  return Builder(s, device, origin).build();
}

ShapeProgram shape_program_from_trace(const AllocTrace& t, uint32_t batch) {
  ShapeProgram p;
  p.batch = batch;
  GraphProgram g;
  g.name = fmt::format("b{}.snapshot", batch);
  std::vector<uint32_t> tensor(t.blocks, UINT32_MAX);  // block id -> tensor index
  std::vector<bool> freed(t.blocks, false);
  for (const TraceOp& op : t.ops)
    if (op.kind == TraceOp::Kind::kFree) freed[op.id] = true;
  for (const TraceOp& op : t.ops) {
    if (op.kind == TraceOp::Kind::kAlloc) {
      tensor[op.id] = static_cast<uint32_t>(g.tensors.size());
      g.tensors.push_back({fmt::format("block{}", op.id), op.bytes,
                           freed[op.id] ? TensorRole::kIntermediate : TensorRole::kOutput});
      g.ops.push_back({ProgramOp::Kind::kAlloc, tensor[op.id]});
    } else if (op.kind == TraceOp::Kind::kFree && tensor[op.id] != UINT32_MAX) {
      g.ops.push_back({ProgramOp::Kind::kFree, tensor[op.id]});
    }  // frees of blocks from before the capture: not graph memory
  }
  p.graphs.push_back(std::move(g));
  return p;
}

std::string validate(const AllocTrace& t) {
  std::vector<uint8_t> state(t.blocks, 0);  // 0 unused, 1 live, 2 freed
  for (const auto& seg : t.initial) {
    for (const auto& b : seg.blocks) {
      if (b.id >= t.blocks || state[b.id] != 0)
        return fmt::format("initial block id {} reused", b.id);
      if (b.offset >= seg.size || b.requested == 0)
        return fmt::format("initial block {} is bad", b.id);
      state[b.id] = 1;
    }
  }
  if (t.recorded && t.recorded_reserved.size() != t.ops.size())
    return "recorded_reserved does not have one value per op";
  for (size_t k = 0; k < t.ops.size(); ++k) {
    const TraceOp& op = t.ops[k];
    if (op.stream >= t.streams) return fmt::format("op {}: stream {} out of range", k, op.stream);
    if (op.kind == TraceOp::Kind::kEmptyCache) continue;
    if (op.id >= t.blocks) return fmt::format("op {}: id {} out of range", k, op.id);
    if (op.kind == TraceOp::Kind::kAlloc) {
      if (op.bytes == 0) return fmt::format("op {}: alloc of 0 bytes", k);
      if (state[op.id] != 0) return fmt::format("op {}: id {} allocated twice", k, op.id);
      state[op.id] = 1;
    } else {
      if (state[op.id] != 1)
        return fmt::format("op {}: free of id {}, which is not live", k, op.id);
      state[op.id] = 2;
    }
  }
  return {};
}

}  // namespace memsim
