// Trace replay through a caching allocator, and the capacity bisection.
#include "src/drivers/trace_replay.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "workload/snapshot.h"

namespace memsim {

namespace {

uint64_t device_alloc_calls(const Backend& b) {
  return b.calls_of(Primitive::kDeviceMalloc) + b.calls_of(Primitive::kCreatePhysical);
}

SimTime backend_time(const Backend& b) {
  SimTime t = 0;
  for (int p = 0; p < static_cast<int>(Primitive::kCount); ++p)
    t += b.time_in(static_cast<Primitive>(p));
  return t;
}

}  // namespace

Result<ReplayOutcome> replay_trace(const AllocTrace& trace, CachingAllocator& alloc,
                                   Backend& backend, const ReplayOptions& options) {
  if (std::string why = validate(trace); !why.empty())
    return make_error(ErrorCode::kInvalidArgument, trace.source + ": invalid trace: " + why);
  ReplayOutcome out;
  const uint64_t calls0 = device_alloc_calls(backend);
  const SimTime time0 = backend_time(backend);
  std::vector<DevPtr> ptr(trace.blocks, 0);
  auto stop = [&](uint32_t op, const Error& e) {
    out.failed_op = op;
    out.oom = e.code == ErrorCode::kOutOfMemory;
    out.error = e.message;
  };
  bool stopped = false;
  for (const auto& seg : trace.initial) {
    SegmentImage img;
    img.size = seg.size;
    img.stream = StreamId{seg.stream};
    img.small = seg.small;
    for (const auto& b : seg.blocks) img.blocks.push_back({b.offset, b.requested, b.size});
    Result<std::vector<DevPtr>> r = alloc.adopt_segment(img);
    if (!r.ok()) {
      stop(0, r.error());
      out.error = "the segments live when the trace began do not fit: " + out.error;
      stopped = true;
      break;
    }
    for (size_t k = 0; k < seg.blocks.size(); ++k) ptr[seg.blocks[k].id] = (*r)[k];
  }
  auto observe = [&](uint32_t k, int64_t time_us) {
    const AllocatorStats s = alloc.stats();
    if (s.reserved_bytes > out.peak_reserved) {
      out.peak_reserved = s.reserved_bytes;
      out.allocated_at_peak = s.allocated_bytes;
    }
    out.peak_allocated = std::max(out.peak_allocated, s.allocated_bytes);
    out.peak_requested = std::max(out.peak_requested, s.requested_bytes);
    if (options.series)
      out.series.push_back({k, time_us, s.allocated_bytes, s.requested_bytes, s.reserved_bytes});
    if (trace.recorded && !out.first_mismatch && k < trace.recorded_reserved.size() &&
        s.reserved_bytes != trace.recorded_reserved[k])
      out.first_mismatch = k;
  };
  if (!stopped) {
    const AllocatorStats s = alloc.stats();
    out.peak_reserved = s.reserved_bytes;
    out.allocated_at_peak = s.allocated_bytes;
    out.peak_allocated = s.allocated_bytes;
    out.peak_requested = s.requested_bytes;
  }
  for (uint32_t k = 0; !stopped && k < trace.ops.size(); ++k) {
    const TraceOp& op = trace.ops[k];
    Status st;
    switch (op.kind) {
      case TraceOp::Kind::kAlloc: {
        Result<DevPtr> r = alloc.malloc(op.bytes, StreamId{op.stream});
        if (r.ok()) {
          ptr[op.id] = *r;
        } else {
          st = r.error();
        }
        break;
      }
      case TraceOp::Kind::kFree:
        st = alloc.free(ptr[op.id]);
        break;
      case TraceOp::Kind::kEmptyCache:
        st = alloc.empty_cache();
        break;
    }
    if (!st.ok()) {
      stop(k, st.error());
      stopped = true;
      break;
    }
    out.ops_done = k + 1;
    if (options.check_invariants) {
      std::string why;
      if (!alloc.check_invariants(&why))
        return make_error(
            ErrorCode::kInvalidState,
            fmt::format("{}: allocator invariant broken after op {}: {}", trace.source, k, why));
    }
    observe(k, op.time_us);
    if (options.after_op) options.after_op(k, alloc.stats());
  }
  out.stats = alloc.stats();
  out.device_alloc_calls = device_alloc_calls(backend) - calls0;
  out.backend_ns = backend_time(backend) - time0;
  if (Status s = alloc.release_all(); !s.ok() && out.error.empty())
    out.error = "teardown: " + s.error().message;
  return out;
}

std::string torch_caching_yaml(const SnapshotSettings& s) {
  std::vector<std::string> keys;
  if (s.max_split_size != UINT64_MAX)
    keys.push_back(fmt::format("max_split_size: {}", s.max_split_size));
  bool any = false;
  for (uint32_t d : s.roundup_power2_divisions) any = any || d != 0;
  if (any) {
    std::vector<std::string> slots;
    for (size_t k = 0; k < s.roundup_power2_divisions.size(); ++k)
      slots.push_back(fmt::format("{}MiB: {}", 1u << k, s.roundup_power2_divisions[k]));
    keys.push_back(fmt::format("roundup_power2_divisions: {{{}}}", fmt::join(slots, ", ")));
  }
  if (s.expandable_segments) keys.push_back("expandable_segments: true");
  if (s.garbage_collection_threshold > 0)
    keys.push_back(fmt::format("garbage_collection_threshold: {}", s.garbage_collection_threshold));
  return fmt::format("{{{}}}", fmt::join(keys, ", "));
}

uint64_t min_capacity(const AllocTrace& trace, const AllocatorFactory& factory, const GpuSpec& gpu,
                      uint64_t lo, uint64_t hi) {
  const uint64_t g = gpu.granularity;
  auto fits = [&](uint64_t capacity) {
    SimClock clock;
    GpuSpec spec = gpu;
    spec.capacity = capacity;
    SimBackend backend(spec, clock);
    auto alloc = factory(backend);
    ReplayOptions opt;
    opt.series = false;
    Result<ReplayOutcome> r = replay_trace(trace, *alloc, backend, opt);
    return r.ok() && r->error.empty();
  };
  uint64_t l = lo / g, h = (hi + g - 1) / g;  // invariant: h fits, l - 1 ... l may not
  if (l == 0) l = 1;
  if (l >= h) return h * g;
  --l;  // treat l as not fitting (probe everything above it)
  while (h - l > 1) {
    const uint64_t mid = l + (h - l) / 2;
    if (fits(mid * g)) {
      h = mid;
    } else {
      l = mid;
    }
  }
  return h * g;
}

}  // namespace memsim
