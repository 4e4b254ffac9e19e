// Internal to the CUDA backend: driver entry points, the tables of what is held (real ranges,
// handles, graphs, with their shadow counterparts) and CudaBackend::Impl. Not a public header.
#pragma once

#include "backends/cuda/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <utility>

#include "kernels/fill.h"

namespace memsim {
namespace cuda_detail {

using P = Primitive;

// Driver API entry points, fetched through the runtime so the binary does not need libcuda.so.1
// to start: on a machine without a driver, create() reports kNotSupported instead.
// clang-format off
#define MEMSIM_DRIVER_CALLS(X)                                                             \
  X(cuInit) X(cuDeviceGet) X(cuGetErrorString) X(cuMemGetAllocationGranularity)            \
  X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap)    \
  X(cuMemUnmap) X(cuMemSetAccess)
// clang-format on

struct Driver {
#define MEMSIM_DRIVER_FIELD(fn) decltype(&::fn) fn = nullptr;
  MEMSIM_DRIVER_CALLS(MEMSIM_DRIVER_FIELD)
#undef MEMSIM_DRIVER_FIELD

  bool load() {
    bool all = true;
#define MEMSIM_DRIVER_LOAD(fn) all = all && load_one(fn, #fn);
    MEMSIM_DRIVER_CALLS(MEMSIM_DRIVER_LOAD)
#undef MEMSIM_DRIVER_LOAD
    return all;
  }

  template <class F>
  static bool load_one(F*& fn, const char* symbol) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion(symbol, &p, CUDA_VERSION, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) return false;
    fn = reinterpret_cast<F*>(p);
    return true;
  }
};

inline CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// A runtime failure as kDriverError; clears the runtime's last-error slot so that a later
// cudaGetLastError() (kernel launch checks) does not report it again.
inline Status check(const char* call, cudaError_t e) {
  if (e == cudaSuccess) return {};
  (void)cudaGetLastError();
  return make_error(ErrorCode::kDriverError, fmt::format("{}: {}", call, cudaGetErrorString(e)));
}

template <class T = void>
T* ptr(DevPtr p) {
  return reinterpret_cast<T*>(p);
}

template <class T>
DevPtr addr(T* p) {
  return reinterpret_cast<DevPtr>(p);
}

enum class Kind : uint8_t { kReservation, kDevice, kAsync, kGraph, kPinned };

struct MapRec {
  uint64_t bytes = 0;
  uint64_t handle = 0;
  bool access = false;  // cuMemSetAccess done since it was mapped
  bool orphan = false;  // unmapped in the shadow, real unmap failed: still mapped
};

// A real address range the backend holds, with the shadow's address of the same object.
struct Range {
  Range(DevPtr s, uint64_t n, Kind k, uint32_t stream = 0)
      : shadow(s), size(n), kind(k), capture_stream(stream) {}
  DevPtr shadow = 0;
  uint64_t size = 0;
  Kind kind = Kind::kDevice;
  bool orphan = false;              // released in the shadow, real release failed: still held
  std::map<uint64_t, MapRec> maps;  // reservations: offset -> mapping
  // Graph allocations (malloc_async during capture), mirroring the shadow's model.
  uint32_t capture_stream = 0;
  uint64_t graph = 0;  // owning graph id; 0 while its capture is open
  bool freed_in_graph = false;
  bool live = false;  // launched and not freed since: physical memory attached
  bool graph_destroyed = false;
};

struct HandleRec {
  CUmemGenericAllocationHandle cu = 0;
  uint32_t mappings = 0;
  bool cu_live = true;  // cuMemRelease not yet called successfully
  bool orphan = false;  // released in the shadow, cuMemRelease failed
};

struct GraphRec {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<DevPtr> allocs;
  std::vector<DevPtr> frees_of_others;  // free nodes of other graphs' allocations
  bool orphan = false;                  // destroyed in the shadow, real destroy failed
};

// Marks a record whose shadow object is gone but whose real release failed; returns the error.
template <class Rec>
Error orphaned(Rec& rec, const Status& s) {
  rec.orphan = true;
  return s.error();
}

}  // namespace cuda_detail

// The two translation units of CudaBackend (calls, teardown) share these names.
using namespace cuda_detail;  // NOLINT(google-build-using-namespace): internal header

struct CudaBackend::Impl {
  Impl(SimBackend& s, const Driver& d, int dev, bool sync)
      : shadow(s), drv(d), device(dev), sync_for_timing(sync) {}

  SimBackend& shadow;
  Driver drv;
  int device;
  bool sync_for_timing;
  bool closed = false;
  std::map<DevPtr, Range> ranges;         // real base -> range
  std::map<uint64_t, HandleRec> handles;  // PhysHandle id (the shadow's) -> CU handle
  std::map<uint32_t, cudaStream_t> streams;
  std::map<uint32_t, GraphRec> captures;        // open captures by stream id (no graph yet)
  std::map<uint32_t, uint32_t> capture_member;  // stream forked into a capture -> its origin
  std::map<uint64_t, GraphRec> graphs;          // GraphHandle id (the shadow's)
  unsigned long long* counter = nullptr;        // VerifyKernel's device counter
  std::array<SimTime, static_cast<size_t>(P::kCount)> measured_ns{};
  std::array<uint64_t, static_cast<size_t>(P::kCount)> measured_calls{};
  std::vector<CudaBackend::CallSample>* call_log = nullptr;

  Status check(const char* call, CUresult r) const {
    if (r == CUDA_SUCCESS) return {};
    const char* s = nullptr;
    if (drv.cuGetErrorString(r, &s) != CUDA_SUCCESS || s == nullptr) s = "unknown driver error";
    return make_error(ErrorCode::kDriverError, fmt::format("{}: {}", call, s));
  }
  Status check(const char* call, cudaError_t e) const { return memsim::check(call, e); }

  template <class F>
  auto timed(P p, F&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = fn();
    const auto dt = std::chrono::steady_clock::now() - t0;
    const SimTime ns = std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count();
    measured_ns[static_cast<size_t>(p)] += ns;
    ++measured_calls[static_cast<size_t>(p)];
    // Teardown calls the shadow did not price (release_everything) are not samples.
    if (call_log && shadow.last_call().p == p) call_log->push_back({shadow.last_call(), ns});
    return r;
  }

  // One real call, timed as `p`, as a Status.
  template <class F>
  Status run(P p, const char* call, F&& fn) {
    return check(call, timed(p, std::forward<F>(fn)));
  }

  // Enqueues work timed as `p`; with sync_for_timing, the stream sync is inside the timing.
  // *issued tells whether the work itself was enqueued (the sync may still have failed).
  template <class F>
  Status work(P p, const char* call, cudaStream_t s, bool capturing, F&& fn,
              bool* issued = nullptr) {
    const char* failed = call;
    const cudaError_t e = timed(p, [&] {
      cudaError_t x = fn();
      if (x != cudaSuccess || !sync_for_timing || capturing) return x;
      failed = "cudaStreamSynchronize";
      return cudaStreamSynchronize(s);
    });
    if (issued) *issued = e == cudaSuccess || failed != call;
    return check(failed, e);
  }

  // Runs the shadow's inverse of a step whose real call failed; returns the real error.
  template <class F>
  Error undo(const Status& real, F&& inverse) {
    (void)inverse();
    return real.error();
  }

  // Releases the real object of range `p`, already released in the shadow: erased when done,
  // kept as an orphan (held, invisible) for teardown when the call fails.
  template <class F>
  Status drop_range(DevPtr p, P prim, const char* call, F&& release) {
    auto it = ranges.find(p);
    if (it == ranges.end()) return {};
    const Status s = run(prim, call, [&] { return release(it->second); });
    if (!s.ok()) return orphaned(it->second, s);
    ranges.erase(it);
    return {};
  }

  // The live (non-orphan) range containing p, with its real base.
  std::pair<DevPtr, Range*> find_range(DevPtr p) {
    auto it = ranges.upper_bound(p);
    if (it == ranges.begin()) return {0, nullptr};
    --it;
    if (p - it->first >= it->second.size || it->second.orphan) return {0, nullptr};
    return {it->first, &it->second};
  }

  // The shadow's address for p. An address in no live range becomes one the shadow cannot know
  // (below its VA bases, same granularity residue) so it reports the same misuse as in sim;
  // fill/copy pass it unchanged (the shadow checks only for null) and check_access rejects it.
  DevPtr to_shadow(DevPtr p, bool raw_fallback = false) {
    auto [base, r] = find_range(p);
    if (r) return r->shadow + (p - base);
    return raw_fallback ? p : p % shadow.granularity();
  }

  Result<cudaStream_t> stream_of(StreamId s) const {
    auto it = streams.find(s.id);
    if (it == streams.end())
      return make_error(ErrorCode::kInvalidArgument, fmt::format("unknown stream {}", s.id));
    return it->second;
  }

  bool capturing(StreamId s) const {
    return captures.count(s.id) != 0 || capture_member.count(s.id) != 0;
  }
  // The stream id whose capture `s` belongs to (s itself unless forked into another's).
  uint32_t capture_key(StreamId s) const {
    auto it = capture_member.find(s.id);
    return it == capture_member.end() ? s.id : it->second;
  }

  // Whether kernels may touch [p, p+bytes): inside one live range; for reservations, every byte
  // mapped with access set; graph allocations live, or referenced from a capture.
  Status check_access(DevPtr p, uint64_t bytes, bool in_capture, const char* what) {
    auto [base, r] = find_range(p);
    const auto bad = [&](const char* why) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{}: {:#x}+{} {}", what, p, bytes, why));
    };
    if (r == nullptr || bytes > r->size - (p - base))
      return bad("is not inside one live allocation");
    if (r->kind == Kind::kReservation) {
      const uint64_t off = p - base, end = off + bytes;
      auto it = r->maps.upper_bound(off);
      if (it == r->maps.begin()) return bad("is not mapped");
      for (uint64_t cursor = (--it)->first; cursor < end; cursor += (it++)->second.bytes) {
        if (it == r->maps.end() || it->first != cursor || it->second.orphan)
          return bad("is not fully mapped");
        if (!it->second.access) return bad("is mapped without access (set_access)");
      }
    } else if (r->kind == Kind::kGraph && !in_capture && !r->live) {
      return bad("is a graph allocation that is not live");
    }
    return {};
  }

  void unmap_done(Range& r, std::map<uint64_t, MapRec>::iterator it) {
    auto h = handles.find(it->second.handle);
    if (h != handles.end() && --h->second.mappings == 0 && !h->second.cu_live) handles.erase(h);
    r.maps.erase(it);
  }

  Status destroy_real_graph(GraphRec& g) {
    return timed(P::kDestroyGraph, [&]() -> Status {
      if (g.exec) MEMSIM_TRY(check("cudaGraphExecDestroy", cudaGraphExecDestroy(g.exec)));
      g.exec = nullptr;
      if (g.graph) MEMSIM_TRY(check("cudaGraphDestroy", cudaGraphDestroy(g.graph)));
      g.graph = nullptr;
      return {};
    });
  }

  // After a graph is destroyed: allocations not live lose their VA, live ones outlive it.
  void graph_gone(const GraphRec& g) {
    for (DevPtr va : g.allocs) {
      auto it = ranges.find(va);
      if (it == ranges.end() || it->second.kind != Kind::kGraph) continue;
      it->second.graph_destroyed = true;
      if (!it->second.live) ranges.erase(it);
    }
  }

  void mirror_release_in_shadow();
  Status release_real();
};

}  // namespace memsim
