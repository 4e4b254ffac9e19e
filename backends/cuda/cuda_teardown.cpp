// CudaBackend teardown: releases every resource still held, once, in a safe order, and mirrors
// the releases in the shadow.
#include "backends/cuda/cuda_backend_impl.h"

namespace memsim {

// ---- teardown -------------------------------------------------------------------------------

Status CudaBackend::release_everything() {
  Impl& m = *impl_;
  if (m.closed) return {};
  m.mirror_release_in_shadow();
  Status s = m.release_real();
  m.closed = true;
  return s;
}

// The shadow's view of the same releases (errors, e.g. injected faults, are ignored).
void CudaBackend::Impl::mirror_release_in_shadow() {
  for (const auto& [sid, cap] : captures) {
    auto g = shadow.end_capture(StreamId{sid});
    if (g.ok()) (void)shadow.destroy_graph(*g);
  }
  for (const auto& [gid, g] : graphs)
    if (!g.orphan) (void)shadow.destroy_graph(GraphHandle{gid});
  for (const auto& [base, r] : ranges) {
    if (r.orphan) continue;
    if (r.kind == Kind::kAsync || (r.kind == Kind::kGraph && r.live))
      (void)shadow.free_async(r.shadow, StreamId{0});
    else if (r.kind == Kind::kDevice)
      (void)shadow.device_free(r.shadow);
    else if (r.kind == Kind::kPinned)
      (void)shadow.host_free_pinned(r.shadow);
    for (const auto& [off, mp] : r.maps)
      if (!mp.orphan) (void)shadow.unmap(r.shadow + off, mp.bytes);
  }
  for (const auto& [id, h] : handles)
    if (h.cu_live && !h.orphan) (void)shadow.release_physical(PhysHandle{id});
  for (const auto& [base, r] : ranges)
    if (r.kind == Kind::kReservation && !r.orphan) (void)shadow.free_virtual(r.shadow);
  (void)shadow.graph_mem_trim();
}

// Releases every real resource still held, each once; what fails to release stays in the
// tables (so a second call retries it and nothing is freed twice).
Status CudaBackend::Impl::release_real() {
  Status first;
  const auto note = [&](const Status& s) {
    if (first.ok() && !s.ok()) first = s;
    return s.ok();
  };
  // Open captures end first: synchronizing while a stream captures is illegal.
  for (auto it = captures.begin(); it != captures.end(); it = captures.erase(it)) {
    cudaGraph_t g = nullptr;
    if (auto s = streams.find(it->first); s != streams.end())
      note(check("cudaStreamEndCapture", cudaStreamEndCapture(s->second, &g)));
    if (g) note(check("cudaGraphDestroy", cudaGraphDestroy(g)));
    for (DevPtr va : it->second.allocs) ranges.erase(va);
  }
  note(check("cudaDeviceSynchronize", cudaDeviceSynchronize()));
  for (auto it = graphs.begin(); it != graphs.end();) {
    if (!note(destroy_real_graph(it->second))) {
      ++it;
      continue;
    }
    graph_gone(it->second);
    it = graphs.erase(it);
  }
  // Releases the ranges `pick` selects with `release(base, range)`, erasing those released.
  const auto sweep = [&](auto&& pick, P p, const char* call, auto&& release) {
    for (auto it = ranges.begin(); it != ranges.end();) {
      const bool go = pick(it->second);
      it = go && note(run(p, call, [&] { return release(it->first, it->second); }))
               ? ranges.erase(it)
               : std::next(it);
    }
  };
  // Stream-ordered allocations and live graph outputs, then plain allocations.
  const auto s0 = streams.find(0);
  sweep([](const Range& r) { return r.kind == Kind::kAsync || (r.kind == Kind::kGraph && r.live); },
        P::kFreeAsync, "cudaFreeAsync",
        [&](DevPtr p, const Range&) {
          return s0 != streams.end() ? cudaFreeAsync(ptr(p), s0->second) : cudaFree(ptr(p));
        });
  if (s0 != streams.end()) note(check("cudaStreamSynchronize", cudaStreamSynchronize(s0->second)));
  sweep([](const Range& r) { return r.kind == Kind::kDevice; }, P::kDeviceFree, "cudaFree",
        [](DevPtr p, const Range&) { return cudaFree(ptr(p)); });
  // Mappings, then handles (a released handle's memory goes with its last mapping).
  for (auto& [base, r] : ranges) {
    for (auto it = r.maps.begin(); it != r.maps.end();) {
      const DevPtr va = base + it->first;
      const uint64_t bytes = it->second.bytes;
      if (note(run(P::kUnmap, "cuMemUnmap", [&] { return drv.cuMemUnmap(va, bytes); })))
        unmap_done(r, it++);
      else
        ++it;
    }
  }
  for (auto it = handles.begin(); it != handles.end();) {
    HandleRec& h = it->second;
    if (h.cu_live &&
        note(run(P::kReleasePhysical, "cuMemRelease", [&] { return drv.cuMemRelease(h.cu); })))
      h.cu_live = false;
    it = !h.cu_live && h.mappings == 0 ? handles.erase(it) : std::next(it);
  }
  sweep([](const Range& r) { return r.kind == Kind::kReservation && r.maps.empty(); },
        P::kFreeVirtual, "cuMemAddressFree",
        [&](DevPtr p, const Range& r) { return drv.cuMemAddressFree(p, r.size); });
  sweep([](const Range& r) { return r.kind == Kind::kPinned; }, P::kHostFreePinned, "cudaFreeHost",
        [](DevPtr p, const Range&) { return cudaFreeHost(ptr(p)); });
  note(run(P::kGraphMemTrim, "cudaDeviceGraphMemTrim",
           [&] { return cudaDeviceGraphMemTrim(device); }));
  if (counter != nullptr && note(check("cudaFree", cudaFree(counter)))) counter = nullptr;
  for (auto it = streams.begin(); it != streams.end();) {
    const bool gone = note(check("cudaStreamDestroy", cudaStreamDestroy(it->second)));
    it = gone ? streams.erase(it) : std::next(it);
  }
  return first;
}

}  // namespace memsim
