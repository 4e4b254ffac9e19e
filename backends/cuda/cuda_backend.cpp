// CudaBackend implementation: shadow-first validation, address translation, real driver calls
// (VMM through driver entry points, the rest through the runtime), timing, and teardown.
#include "backends/cuda/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <utility>

#include "kernels/fill.h"

namespace memsim {
namespace {

constexpr size_t kPrimitives = static_cast<size_t>(Primitive::kCount);

// Driver API entry points, fetched through the runtime so the binary does not need libcuda.so.1
// to start: on a machine without a driver, create() reports kNotSupported instead.
struct Driver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
};

template <class F>
bool load(F*& fn, const char* symbol) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &p, CUDA_VERSION, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) return false;
  fn = reinterpret_cast<F*>(p);
  return true;
}

bool load_driver(Driver* d) {
  return load(d->init, "cuInit") && load(d->device_get, "cuDeviceGet") &&
         load(d->error_string, "cuGetErrorString") &&
         load(d->granularity, "cuMemGetAllocationGranularity") &&
         load(d->create, "cuMemCreate") && load(d->release, "cuMemRelease") &&
         load(d->reserve, "cuMemAddressReserve") && load(d->address_free, "cuMemAddressFree") &&
         load(d->map, "cuMemMap") && load(d->unmap, "cuMemUnmap") &&
         load(d->set_access, "cuMemSetAccess");
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// A runtime failure as kDriverError; clears the runtime's last-error slot so that a later
// cudaGetLastError() (kernel launch checks) does not report it again.
Error rt_error(const char* call, cudaError_t e) {
  (void)cudaGetLastError();
  return make_error(ErrorCode::kDriverError, fmt::format("{}: {}", call, cudaGetErrorString(e)));
}

Status rt_status(const char* call, cudaError_t e) {
  if (e == cudaSuccess) return {};
  return rt_error(call, e);
}

template <class P>
DevPtr addr(P* p) {
  return reinterpret_cast<DevPtr>(p);
}

template <class P = void>
P* ptr(DevPtr p) {
  return reinterpret_cast<P*>(p);
}

Error closed_error() {
  return make_error(ErrorCode::kInvalidState, "cuda backend: used after release_everything()");
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

Range make_range(DevPtr shadow, uint64_t size, Kind kind) {
  Range r;
  r.shadow = shadow;
  r.size = size;
  r.kind = kind;
  return r;
}

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
  std::vector<DevPtr> frees_of_others;
  bool orphan = false;  // destroyed in the shadow, real destroy failed
};

struct CaptureRec {
  std::vector<DevPtr> allocs;
  std::vector<DevPtr> frees_of_others;
};

}  // namespace

struct CudaBackend::Impl {
  Impl(GpuSpec spec, SimClock& clock, MetricsRecorder* metrics, std::vector<FaultInjection> faults,
       const Driver& d, int dev, bool sync)
      : shadow(std::move(spec), clock, metrics, std::move(faults)),
        drv(d),
        device(dev),
        sync_for_timing(sync) {}

  SimBackend shadow;
  Driver drv;
  int device;
  bool sync_for_timing;
  bool closed = false;
  std::map<DevPtr, Range> ranges;  // real base -> range
  std::map<uint64_t, HandleRec> handles;  // PhysHandle id (the shadow's) -> CU handle
  std::map<uint32_t, cudaStream_t> streams;
  std::map<uint32_t, CaptureRec> captures;  // open captures by stream id
  std::map<uint64_t, GraphRec> graphs;      // GraphHandle id (the shadow's)
  unsigned long long* counter = nullptr;    // VerifyKernel's device counter
  std::array<SimTime, kPrimitives> measured_ns{};
  std::array<uint64_t, kPrimitives> measured_calls{};

  template <class F>
  auto timed(Primitive p, F&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = fn();
    const auto dt = std::chrono::steady_clock::now() - t0;
    measured_ns[static_cast<size_t>(p)] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count();
    ++measured_calls[static_cast<size_t>(p)];
    return r;
  }

  // Enqueues work timed as `p`; with sync_for_timing, the stream sync is inside the timing.
  // *issued tells whether the work itself was enqueued (the sync may still have failed).
  template <class F>
  Status work(Primitive p, const char* call, cudaStream_t s, bool capturing, F&& fn,
              bool* issued = nullptr) {
    const char* failed = call;
    const cudaError_t e = timed(p, [&] {
      cudaError_t x = fn();
      if (x == cudaSuccess && sync_for_timing && !capturing) {
        failed = "cudaStreamSynchronize";
        x = cudaStreamSynchronize(s);
      }
      return x;
    });
    if (issued) *issued = e == cudaSuccess || failed != call;
    return rt_status(failed, e);
  }

  Error cu_error(const char* call, CUresult r) const {
    const char* s = nullptr;
    if (drv.error_string == nullptr || drv.error_string(r, &s) != CUDA_SUCCESS || s == nullptr)
      s = "unknown driver error";
    return make_error(ErrorCode::kDriverError, fmt::format("{}: {}", call, s));
  }

  Status cu_status(const char* call, CUresult r) const {
    if (r == CUDA_SUCCESS) return {};
    return cu_error(call, r);
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

  bool capturing(StreamId s) const { return captures.count(s.id) != 0; }

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
      --it;
      for (uint64_t cursor = it->first; cursor < end; ++it) {
        if (it == r->maps.end() || it->first != cursor || it->second.orphan)
          return bad("is not fully mapped");
        if (!it->second.access) return bad("is mapped without access (set_access)");
        cursor += it->second.bytes;
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
    return timed(Primitive::kDestroyGraph, [&]() -> Status {
      if (g.exec) {
        MEMSIM_TRY(rt_status("cudaGraphExecDestroy", cudaGraphExecDestroy(g.exec)));
        g.exec = nullptr;
      }
      if (g.graph) {
        MEMSIM_TRY(rt_status("cudaGraphDestroy", cudaGraphDestroy(g.graph)));
        g.graph = nullptr;
      }
      return {};
    });
  }

  // After a graph is destroyed: allocations not live lose their VA, live ones outlive it.
  void graph_gone(const GraphRec& g) {
    for (DevPtr va : g.allocs) {
      auto it = ranges.find(va);
      if (it == ranges.end() || it->second.kind != Kind::kGraph) continue;
      if (it->second.live)
        it->second.graph_destroyed = true;
      else
        ranges.erase(it);
    }
  }

  void mirror_release_in_shadow();
  Status release_real();
};

// ---- creation and observation ---------------------------------------------------------------

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  if (impl_) (void)impl_->release_real();
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(GpuSpec cost_model, SimClock& clock,
                                                         MetricsRecorder* metrics, int device,
                                                         bool sync_for_timing,
                                                         std::vector<FaultInjection> faults) {
  int count = 0;
  const cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("no CUDA device: {}", ce != cudaSuccess ? cudaGetErrorString(ce)
                                                                          : "device count is 0"));
  }
  if (device < 0 || device >= count)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("CUDA device {} not present ({} device(s))", device, count));
  Driver drv;
  if (!load_driver(&drv))
    return make_error(ErrorCode::kDriverError,
                      "cudaGetDriverEntryPointByVersion: VMM driver entry points not found");
  if (const CUresult r = drv.init(0); r != CUDA_SUCCESS)
    return make_error(ErrorCode::kNotSupported, fmt::format("cuInit failed ({})", int(r)));
  CUdevice dev = 0;
  if (const CUresult r = drv.device_get(&dev, device); r != CUDA_SUCCESS)
    return make_error(ErrorCode::kNotSupported, fmt::format("cuDeviceGet failed ({})", int(r)));
  // cudaSetDevice makes the primary context current on this thread (driver calls use it too).
  MEMSIM_TRY(rt_status("cudaSetDevice", cudaSetDevice(device)));
  MEMSIM_TRY(rt_status("cudaFree", cudaFree(nullptr)));
  const CUmemAllocationProp prop = device_prop(device);
  size_t gran = 0;
  if (const CUresult r =
          drv.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS || gran == 0) {
    const char* s = nullptr;
    drv.error_string(r, &s);
    return make_error(ErrorCode::kDriverError,
                      fmt::format("cuMemGetAllocationGranularity: {}", s ? s : "granularity 0"));
  }
  size_t free_bytes = 0, total_bytes = 0;
  MEMSIM_TRY(rt_status("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total_bytes)));
  cost_model.granularity = gran;
  cost_model.capacity = total_bytes;

  std::unique_ptr<CudaBackend> b(new CudaBackend(std::make_unique<Impl>(
      std::move(cost_model), clock, metrics, std::move(faults), drv, device, sync_for_timing)));
  cudaStream_t s0 = nullptr;
  MEMSIM_TRY(rt_status("cudaStreamCreateWithFlags",
                       cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking)));
  b->impl_->streams.emplace(0, s0);
  MEMSIM_TRY(rt_status("cudaMalloc", cudaMalloc(reinterpret_cast<void**>(&b->impl_->counter), sizeof(unsigned long long))));
  return Result<std::unique_ptr<CudaBackend>>(std::move(b));
}

uint64_t CudaBackend::granularity() const { return impl_->shadow.granularity(); }
uint64_t CudaBackend::capacity() const { return impl_->shadow.capacity(); }
Usage CudaBackend::usage() const { return impl_->shadow.usage(); }
SimTime CudaBackend::now() const { return impl_->shadow.now(); }
SimTime CudaBackend::time_in(Primitive p) const { return impl_->shadow.time_in(p); }
uint64_t CudaBackend::calls_of(Primitive p) const { return impl_->shadow.calls_of(p); }
const SimBackend& CudaBackend::shadow() const { return impl_->shadow; }
int CudaBackend::device() const { return impl_->device; }

SimTime CudaBackend::measured_time_in(Primitive p) const {
  return impl_->measured_ns[static_cast<size_t>(p)];
}

uint64_t CudaBackend::measured_calls_of(Primitive p) const {
  return impl_->measured_calls[static_cast<size_t>(p)];
}

Result<CudaBackend::DeviceObservation> CudaBackend::observe() const {
  DeviceObservation o;
  size_t free_bytes = 0, total_bytes = 0;
  MEMSIM_TRY(rt_status("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total_bytes)));
  o.free_bytes = free_bytes;
  o.total_bytes = total_bytes;
  const std::pair<cudaGraphMemAttributeType, uint64_t*> attrs[] = {
      {cudaGraphMemAttrUsedMemCurrent, &o.graph_used_current},
      {cudaGraphMemAttrUsedMemHigh, &o.graph_used_high},
      {cudaGraphMemAttrReservedMemCurrent, &o.graph_reserved_current},
      {cudaGraphMemAttrReservedMemHigh, &o.graph_reserved_high},
  };
  for (const auto& [attr, out] : attrs) {
    unsigned long long v = 0;  // cuuint64_t
    MEMSIM_TRY(rt_status("cudaDeviceGetGraphMemAttribute",
                         cudaDeviceGetGraphMemAttribute(impl_->device, attr, &v)));
    *out = v;
  }
  return o;
}

#define MEMSIM_CUDA_OPEN(m) \
  if ((m).closed) return closed_error()

// ---- physical and virtual -------------------------------------------------------------------

Result<PhysHandle> CudaBackend::create_physical(uint64_t bytes, std::string_view tag) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(PhysHandle h, m.shadow.create_physical(bytes, tag));
  const CUmemAllocationProp prop = device_prop(m.device);
  CUmemGenericAllocationHandle cu = 0;
  const CUresult r =
      m.timed(Primitive::kCreatePhysical, [&] { return m.drv.create(&cu, bytes, &prop, 0); });
  if (r != CUDA_SUCCESS) {
    (void)m.shadow.release_physical(h);
    return m.cu_error("cuMemCreate", r);
  }
  m.handles.insert_or_assign(h.id, HandleRec{.cu = cu});
  return h;
}

Status CudaBackend::release_physical(PhysHandle h) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_TRY(m.shadow.release_physical(h));
  auto it = m.handles.find(h.id);
  if (it == m.handles.end() || !it->second.cu_live) return {};  // the shadow knew it live
  const CUresult r =
      m.timed(Primitive::kReleasePhysical, [&] { return m.drv.release(it->second.cu); });
  if (r != CUDA_SUCCESS) {
    it->second.orphan = true;
    return m.cu_error("cuMemRelease", r);
  }
  it->second.cu_live = false;
  if (it->second.mappings == 0) m.handles.erase(it);
  return {};
}

Result<DevPtr> CudaBackend::reserve_virtual(uint64_t bytes, uint64_t align) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(DevPtr sva, m.shadow.reserve_virtual(bytes, align));
  CUdeviceptr va = 0;
  const CUresult r = m.timed(Primitive::kReserveVirtual,
                             [&] { return m.drv.reserve(&va, bytes, align, 0, 0); });
  if (r != CUDA_SUCCESS) {
    (void)m.shadow.free_virtual(sva);
    return m.cu_error("cuMemAddressReserve", r);
  }
  m.ranges.insert_or_assign(va, make_range(sva, bytes, Kind::kReservation));
  return static_cast<DevPtr>(va);
}

Status CudaBackend::free_virtual(DevPtr va) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_TRY(m.shadow.free_virtual(m.to_shadow(va)));
  auto it = m.ranges.find(va);
  if (it == m.ranges.end()) return {};
  const CUresult r = m.timed(Primitive::kFreeVirtual,
                             [&] { return m.drv.address_free(va, it->second.size); });
  if (r != CUDA_SUCCESS) {
    it->second.orphan = true;
    return m.cu_error("cuMemAddressFree", r);
  }
  m.ranges.erase(it);
  return {};
}

// ---- mapping --------------------------------------------------------------------------------

Status CudaBackend::map(DevPtr va, uint64_t bytes, PhysHandle h, uint64_t offset) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  auto [base, range] = m.find_range(va);
  const DevPtr sva = m.to_shadow(va);
  MEMSIM_TRY(m.shadow.map(sva, bytes, h, offset));
  auto hit = m.handles.find(h.id);
  if (range == nullptr || hit == m.handles.end()) {  // unreachable: the shadow accepted
    (void)m.shadow.unmap(sva, bytes);
    return make_error(ErrorCode::kInvalidState, "map: backend tables out of step with shadow");
  }
  const CUresult r = m.timed(
      Primitive::kMap, [&] { return m.drv.map(va, bytes, offset, hit->second.cu, 0); });
  if (r != CUDA_SUCCESS) {
    (void)m.shadow.unmap(sva, bytes);
    return m.cu_error("cuMemMap", r);
  }
  range->maps.insert_or_assign(va - base, MapRec{.bytes = bytes, .handle = h.id});
  ++hit->second.mappings;
  return {};
}

Status CudaBackend::unmap(DevPtr va, uint64_t bytes) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  auto [base, range] = m.find_range(va);
  MEMSIM_TRY(m.shadow.unmap(m.to_shadow(va), bytes));
  if (range == nullptr) return {};
  const uint64_t off = va - base;
  const CUresult r = m.timed(Primitive::kUnmap, [&] { return m.drv.unmap(va, bytes); });
  auto it = range->maps.lower_bound(off);
  const auto last = range->maps.lower_bound(off + bytes);
  if (r != CUDA_SUCCESS) {
    for (; it != last; ++it) it->second.orphan = true;  // still mapped; teardown unmaps
    return m.cu_error("cuMemUnmap", r);
  }
  while (it != last) m.unmap_done(*range, it++);
  return {};
}

Status CudaBackend::set_access(DevPtr va, uint64_t bytes) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  auto [base, range] = m.find_range(va);
  MEMSIM_TRY(m.shadow.set_access(m.to_shadow(va), bytes));
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = m.device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult r =
      m.timed(Primitive::kSetAccess, [&] { return m.drv.set_access(va, bytes, &desc, 1); });
  MEMSIM_TRY(m.cu_status("cuMemSetAccess", r));
  if (range == nullptr) return {};
  const uint64_t off = va - base;
  for (auto it = range->maps.lower_bound(off); it != range->maps.end() && it->first < off + bytes;
       ++it)
    it->second.access = true;
  return {};
}

// ---- plain and stream-ordered allocations ---------------------------------------------------

Result<DevPtr> CudaBackend::device_malloc(uint64_t bytes, std::string_view tag) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(DevPtr sp, m.shadow.device_malloc(bytes, tag));
  void* p = nullptr;
  const cudaError_t e = m.timed(Primitive::kDeviceMalloc, [&] { return cudaMalloc(&p, bytes); });
  if (e != cudaSuccess) {
    (void)m.shadow.device_free(sp);
    return rt_error("cudaMalloc", e);
  }
  m.ranges.insert_or_assign(addr(p), make_range(sp, bytes, Kind::kDevice));
  return addr(p);
}

Status CudaBackend::device_free(DevPtr p) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_TRY(m.shadow.device_free(m.to_shadow(p)));
  auto it = m.ranges.find(p);  // a device or stream-ordered allocation (cudaFree frees both)
  if (it == m.ranges.end()) return {};
  const cudaError_t e = m.timed(Primitive::kDeviceFree, [&] { return cudaFree(ptr(p)); });
  if (e != cudaSuccess) {
    it->second.orphan = true;
    return rt_error("cudaFree", e);
  }
  m.ranges.erase(it);
  return {};
}

Result<DevPtr> CudaBackend::malloc_async(uint64_t bytes, StreamId stream) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  const bool in_capture = m.capturing(stream);
  MEMSIM_ASSIGN_OR_RETURN(DevPtr sp, m.shadow.malloc_async(bytes, stream));
  void* p = nullptr;
  const cudaError_t e =
      m.timed(Primitive::kMallocAsync, [&] { return cudaMallocAsync(&p, bytes, cs); });
  if (e != cudaSuccess) {
    (void)m.shadow.free_async(sp, stream);
    return rt_error("cudaMallocAsync", e);
  }
  Range r = make_range(sp, bytes, in_capture ? Kind::kGraph : Kind::kAsync);
  r.capture_stream = stream.id;
  m.ranges.insert_or_assign(addr(p), std::move(r));
  if (in_capture) m.captures[stream.id].allocs.push_back(addr(p));
  return addr(p);
}

Status CudaBackend::free_async(DevPtr p, StreamId stream) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  const bool in_capture = m.capturing(stream);
  MEMSIM_TRY(m.shadow.free_async(m.to_shadow(p), stream));
  auto it = m.ranges.find(p);
  if (it == m.ranges.end()) return {};
  const cudaError_t e = m.timed(Primitive::kFreeAsync, [&] { return cudaFreeAsync(ptr(p), cs); });
  Range& r = it->second;
  if (e != cudaSuccess) {
    if (r.kind == Kind::kAsync) r.orphan = true;  // still allocated; teardown frees it
    return rt_error("cudaFreeAsync", e);
  }
  if (in_capture) {
    if (r.kind == Kind::kGraph && r.graph == 0 && r.capture_stream == stream.id)
      r.freed_in_graph = true;
    else
      m.captures[stream.id].frees_of_others.push_back(p);
  } else if (r.kind == Kind::kGraph) {
    r.live = false;
    if (r.graph_destroyed) m.ranges.erase(it);
  } else {
    m.ranges.erase(it);
  }
  return {};
}

Result<DevPtr> CudaBackend::host_malloc_pinned(uint64_t bytes) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(DevPtr sp, m.shadow.host_malloc_pinned(bytes));
  void* p = nullptr;
  const cudaError_t e =
      m.timed(Primitive::kHostMallocPinned, [&] { return cudaMallocHost(&p, bytes); });
  if (e != cudaSuccess) {
    (void)m.shadow.host_free_pinned(sp);
    return rt_error("cudaMallocHost", e);
  }
  m.ranges.insert_or_assign(addr(p), make_range(sp, bytes, Kind::kPinned));
  return addr(p);
}

Status CudaBackend::host_free_pinned(DevPtr p) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_TRY(m.shadow.host_free_pinned(m.to_shadow(p)));
  auto it = m.ranges.find(p);
  if (it == m.ranges.end()) return {};
  const cudaError_t e = m.timed(Primitive::kHostFreePinned, [&] { return cudaFreeHost(ptr(p)); });
  if (e != cudaSuccess) {
    it->second.orphan = true;
    return rt_error("cudaFreeHost", e);
  }
  m.ranges.erase(it);
  return {};
}

// ---- streams and work -----------------------------------------------------------------------

Result<StreamId> CudaBackend::create_stream() {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(StreamId s, m.shadow.create_stream());
  cudaStream_t cs = nullptr;
  MEMSIM_TRY(rt_status("cudaStreamCreateWithFlags",
                       cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking)));
  m.streams.emplace(s.id, cs);
  return s;
}

Status CudaBackend::fill(DevPtr p, uint64_t bytes, uint32_t pattern, StreamId stream) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  const bool in_capture = m.capturing(stream);
  MEMSIM_TRY(m.shadow.fill(m.to_shadow(p, true), bytes, pattern, stream));
  MEMSIM_TRY(m.check_access(p, bytes, in_capture, "fill"));
  return m.work(Primitive::kFill, "FillKernel", cs, in_capture,
                [&] { return launch_fill(cs, p, bytes, pattern); });
}

Status CudaBackend::copy(DevPtr dst, DevPtr src, uint64_t bytes, StreamId stream) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  const bool in_capture = m.capturing(stream);
  MEMSIM_TRY(m.shadow.copy(m.to_shadow(dst, true), m.to_shadow(src, true), bytes, stream));
  MEMSIM_TRY(m.check_access(dst, bytes, in_capture, "copy (destination)"));
  MEMSIM_TRY(m.check_access(src, bytes, in_capture, "copy (source)"));
  // cudaMemcpyDefault: device-to-device, and pinned host memory on either side (UVA).
  return m.work(Primitive::kCopy, "cudaMemcpyAsync", cs, in_capture, [&] {
    return cudaMemcpyAsync(ptr(dst), ptr(src), bytes, cudaMemcpyDefault, cs);
  });
}

Result<uint64_t> CudaBackend::count_mismatches(DevPtr p, uint64_t bytes, uint32_t pattern,
                                               StreamId stream) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  if (m.capturing(stream))
    return make_error(ErrorCode::kInvalidState, "count_mismatches: the stream is capturing");
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "count_mismatches: 0 bytes");
  MEMSIM_TRY(m.check_access(p, bytes, false, "count_mismatches"));
  unsigned long long host = 0;
  MEMSIM_TRY(rt_status("cudaMemsetAsync", cudaMemsetAsync(m.counter, 0, sizeof(host), cs)));
  MEMSIM_TRY(rt_status("VerifyKernel", launch_verify(cs, p, bytes, pattern, m.counter)));
  MEMSIM_TRY(rt_status("cudaMemcpyAsync", cudaMemcpyAsync(&host, m.counter, sizeof(host),
                                                          cudaMemcpyDeviceToHost, cs)));
  MEMSIM_TRY(rt_status("cudaStreamSynchronize", cudaStreamSynchronize(cs)));
  return uint64_t{host};
}

Status CudaBackend::synchronize() {
  MEMSIM_CUDA_OPEN(*impl_);
  return rt_status("cudaDeviceSynchronize", cudaDeviceSynchronize());
}

// ---- graphs ---------------------------------------------------------------------------------

Status CudaBackend::begin_capture(StreamId stream) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  MEMSIM_TRY(m.shadow.begin_capture(stream));
  // Relaxed: other threads (and cudaMalloc from a caching allocator) may run unsafe calls.
  const cudaError_t e = m.timed(Primitive::kBeginCapture, [&] {
    return cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed);
  });
  if (e != cudaSuccess) {
    auto g = m.shadow.end_capture(stream);
    if (g.ok()) (void)m.shadow.destroy_graph(*g);
    return rt_error("cudaStreamBeginCapture", e);
  }
  m.captures.emplace(stream.id, CaptureRec{});
  return {};
}

Result<GraphHandle> CudaBackend::end_capture(StreamId stream) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, m.shadow.end_capture(stream));
  CaptureRec cap = std::move(m.captures[stream.id]);
  m.captures.erase(stream.id);
  GraphRec rec{.allocs = std::move(cap.allocs), .frees_of_others = std::move(cap.frees_of_others)};
  const char* failed = "cudaStreamEndCapture";
  const cudaError_t e = m.timed(Primitive::kEndCapture, [&] {
    cudaError_t x = cudaStreamEndCapture(cs, &rec.graph);
    if (x != cudaSuccess) return x;
    failed = "cudaGraphInstantiateWithFlags";
    x = cudaGraphInstantiateWithFlags(&rec.exec, rec.graph,
                                      cudaGraphInstantiateFlagAutoFreeOnLaunch);
    if (x != cudaSuccess || !m.sync_for_timing) return x;
    failed = "cudaStreamSynchronize";
    return cudaStreamSynchronize(cs);
  });
  if (e != cudaSuccess && rec.exec == nullptr) {
    // No graph: the capture's allocations went with it, in the driver and in the shadow.
    if (rec.graph) (void)cudaGraphDestroy(rec.graph);
    (void)m.shadow.destroy_graph(g);
    for (DevPtr va : rec.allocs) m.ranges.erase(va);
    return rt_error(failed, e);
  }
  for (DevPtr va : rec.allocs)
    if (auto it = m.ranges.find(va); it != m.ranges.end()) it->second.graph = g.id;
  m.graphs.insert_or_assign(g.id, std::move(rec));
  if (e != cudaSuccess) return rt_error(failed, e);  // the graph exists; teardown destroys it
  return g;
}

Status CudaBackend::launch(GraphHandle g, StreamId stream) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  MEMSIM_TRY(m.shadow.launch(g, stream));
  auto it = m.graphs.find(g.id);
  if (it == m.graphs.end()) return {};
  bool issued = false;
  Status s = m.work(
      Primitive::kLaunch, "cudaGraphLaunch", cs, false,
      [&] { return cudaGraphLaunch(it->second.exec, cs); }, &issued);
  if (!issued) return s;
  // Its outputs are live (a relaunch auto-frees and re-allocates them); its free nodes of
  // other graphs' allocations end those.
  for (DevPtr va : it->second.allocs) {
    auto r = m.ranges.find(va);
    if (r != m.ranges.end() && r->second.kind == Kind::kGraph && !r->second.freed_in_graph)
      r->second.live = true;
  }
  for (DevPtr va : it->second.frees_of_others) {
    auto r = m.ranges.find(va);
    if (r == m.ranges.end() || r->second.kind != Kind::kGraph) continue;
    r->second.live = false;
    if (r->second.graph_destroyed) m.ranges.erase(r);
  }
  return s;
}

Status CudaBackend::destroy_graph(GraphHandle g) {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_TRY(m.shadow.destroy_graph(g));
  auto it = m.graphs.find(g.id);
  if (it == m.graphs.end()) return {};
  if (Status s = m.destroy_real_graph(it->second); !s.ok()) {
    it->second.orphan = true;
    return s;
  }
  m.graph_gone(it->second);
  m.graphs.erase(it);
  return {};
}

Status CudaBackend::graph_mem_trim() {
  Impl& m = *impl_;
  MEMSIM_CUDA_OPEN(m);
  MEMSIM_TRY(m.shadow.graph_mem_trim());
  const cudaError_t e =
      m.timed(Primitive::kGraphMemTrim, [&] { return cudaDeviceGraphMemTrim(m.device); });
  return rt_status("cudaDeviceGraphMemTrim", e);
}

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
    switch (r.kind) {
      case Kind::kGraph:
        if (r.live) (void)shadow.free_async(r.shadow, StreamId{0});
        break;
      case Kind::kAsync: (void)shadow.free_async(r.shadow, StreamId{0}); break;
      case Kind::kDevice: (void)shadow.device_free(r.shadow); break;
      case Kind::kPinned: (void)shadow.host_free_pinned(r.shadow); break;
      case Kind::kReservation:
        for (const auto& [off, mp] : r.maps)
          if (!mp.orphan) (void)shadow.unmap(r.shadow + off, mp.bytes);
        break;
    }
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
  const auto note = [&](Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
    return s.ok();
  };
  // Open captures end first: synchronizing while a stream captures is illegal.
  for (auto it = captures.begin(); it != captures.end(); it = captures.erase(it)) {
    cudaGraph_t g = nullptr;
    if (auto s = streams.find(it->first); s != streams.end())
      note(rt_status("cudaStreamEndCapture", cudaStreamEndCapture(s->second, &g)));
    if (g) note(rt_status("cudaGraphDestroy", cudaGraphDestroy(g)));
    for (DevPtr va : it->second.allocs) ranges.erase(va);
  }
  note(rt_status("cudaDeviceSynchronize", cudaDeviceSynchronize()));
  for (auto it = graphs.begin(); it != graphs.end();) {
    if (!note(destroy_real_graph(it->second))) {
      ++it;
      continue;
    }
    graph_gone(it->second);
    it = graphs.erase(it);
  }
  // Stream-ordered allocations and live graph outputs.
  auto s0 = streams.find(0);
  for (auto it = ranges.begin(); it != ranges.end();) {
    const Range& r = it->second;
    const bool async = r.kind == Kind::kAsync || (r.kind == Kind::kGraph && r.live);
    if (!async) {
      ++it;
      continue;
    }
    const cudaError_t e = timed(Primitive::kFreeAsync, [&] {
      return s0 != streams.end() ? cudaFreeAsync(ptr(it->first), s0->second) : cudaFree(ptr(it->first));
    });
    it = note(rt_status("cudaFreeAsync", e)) ? ranges.erase(it) : std::next(it);
  }
  if (s0 != streams.end())
    note(rt_status("cudaStreamSynchronize", cudaStreamSynchronize(s0->second)));
  for (auto it = ranges.begin(); it != ranges.end();) {
    if (it->second.kind != Kind::kDevice) {
      ++it;
      continue;
    }
    const cudaError_t e = timed(Primitive::kDeviceFree, [&] { return cudaFree(ptr(it->first)); });
    it = note(rt_status("cudaFree", e)) ? ranges.erase(it) : std::next(it);
  }
  for (auto& [base, r] : ranges) {
    if (r.kind != Kind::kReservation) continue;
    for (auto it = r.maps.begin(); it != r.maps.end();) {
      const DevPtr va = base + it->first;
      const uint64_t bytes = it->second.bytes;
      const CUresult res = timed(Primitive::kUnmap, [&] { return drv.unmap(va, bytes); });
      if (note(cu_status("cuMemUnmap", res)))
        unmap_done(r, it++);
      else
        ++it;
    }
  }
  for (auto it = handles.begin(); it != handles.end();) {
    HandleRec& h = it->second;
    if (h.cu_live) {
      const CUresult res = timed(Primitive::kReleasePhysical, [&] { return drv.release(h.cu); });
      if (note(cu_status("cuMemRelease", res))) h.cu_live = false;
    }
    it = !h.cu_live && h.mappings == 0 ? handles.erase(it) : std::next(it);
  }
  for (auto it = ranges.begin(); it != ranges.end();) {
    const Range& r = it->second;
    bool freed = false;
    if (r.kind == Kind::kReservation && r.maps.empty()) {
      const CUresult res = timed(Primitive::kFreeVirtual,
                                 [&] { return drv.address_free(it->first, r.size); });
      freed = note(cu_status("cuMemAddressFree", res));
    } else if (r.kind == Kind::kPinned) {
      const cudaError_t e =
          timed(Primitive::kHostFreePinned, [&] { return cudaFreeHost(ptr(it->first)); });
      freed = note(rt_status("cudaFreeHost", e));
    }
    it = freed ? ranges.erase(it) : std::next(it);
  }
  const cudaError_t trim =
      timed(Primitive::kGraphMemTrim, [&] { return cudaDeviceGraphMemTrim(device); });
  note(rt_status("cudaDeviceGraphMemTrim", trim));
  if (counter != nullptr && note(rt_status("cudaFree", cudaFree(counter)))) counter = nullptr;
  for (auto it = streams.begin(); it != streams.end();)
    it = note(rt_status("cudaStreamDestroy", cudaStreamDestroy(it->second))) ? streams.erase(it)
                                                                              : std::next(it);
  return first;
}

}  // namespace memsim
