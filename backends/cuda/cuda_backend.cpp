// CudaBackend implementation: shadow-first validation, address translation, real driver calls
// (VMM through driver entry points, the rest through the runtime) and timing.
#include "backends/cuda/cuda_backend_impl.h"

namespace memsim {

// Every primitive: `m` is the implementation; nothing runs after release_everything().
#define MEMSIM_CUDA_ENTER()                                                                       \
  Impl& m = *impl_;                                                                               \
  if (m.closed)                                                                                   \
    return make_error(ErrorCode::kInvalidState, "cuda backend: used after release_everything()"); \
  static_assert(true)

// ---- creation and observation ---------------------------------------------------------------

CudaBackend::CudaBackend(GpuSpec spec, SimClock& clock, MetricsRecorder* metrics,
                         std::vector<FaultInjection> faults, int device)
    : shadow_(std::move(spec), clock, metrics, std::move(faults)), device_(device) {}

CudaBackend::~CudaBackend() {
  if (impl_) (void)impl_->release_real();
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(GpuSpec cost_model, SimClock& clock,
                                                         MetricsRecorder* metrics, int device,
                                                         bool sync_for_timing,
                                                         std::vector<FaultInjection> faults) {
  int count = 0;
  const cudaError_t ce = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  if (ce != cudaSuccess || count == 0)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("no CUDA device: {}", ce != cudaSuccess ? cudaGetErrorString(ce)
                                                                          : "device count is 0"));
  if (device < 0 || device >= count)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("CUDA device {} not present ({} device(s))", device, count));
  Driver drv;
  if (!drv.load())
    return make_error(ErrorCode::kDriverError,
                      "cudaGetDriverEntryPointByVersion: VMM driver entry points not found");
  CUdevice dev = 0;
  if (drv.cuInit(0) != CUDA_SUCCESS || drv.cuDeviceGet(&dev, device) != CUDA_SUCCESS)
    return make_error(ErrorCode::kNotSupported, "cuInit/cuDeviceGet failed: no usable device");
  // cudaSetDevice makes the primary context current on this thread (driver calls use it too).
  MEMSIM_TRY(check("cudaSetDevice", cudaSetDevice(device)));
  MEMSIM_TRY(check("cudaFree", cudaFree(nullptr)));
  const CUmemAllocationProp prop = device_prop(device);
  size_t gran = 0;
  if (drv.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
          CUDA_SUCCESS ||
      gran == 0)
    return make_error(ErrorCode::kDriverError, "cuMemGetAllocationGranularity failed");
  size_t free_bytes = 0, total_bytes = 0;
  MEMSIM_TRY(check("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total_bytes)));
  cost_model.granularity = gran;
  cost_model.capacity = total_bytes;
  // The shadow refuses where the device would: what is not free now (this process's context,
  // and anything other processes hold) counts against the capacity, as the GPU file's
  // `context:` does on the sim backend.
  cost_model.context = total_bytes - free_bytes;

  std::unique_ptr<CudaBackend> b(
      new CudaBackend(std::move(cost_model), clock, metrics, std::move(faults), device));
  b->impl_ = std::make_unique<Impl>(b->shadow_, drv, device, sync_for_timing);
  Impl& m = *b->impl_;
  cudaStream_t s0 = nullptr;
  MEMSIM_TRY(
      check("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking)));
  m.streams.emplace(0, s0);
  MEMSIM_TRY(check("cudaMalloc",
                   cudaMalloc(reinterpret_cast<void**>(&m.counter), sizeof(unsigned long long))));
  return Result<std::unique_ptr<CudaBackend>>(std::move(b));
}

SimTime CudaBackend::measured_time_in(Primitive p) const {
  return impl_->measured_ns[static_cast<size_t>(p)];
}

void CudaBackend::record_calls(std::vector<CallSample>* log) {
  impl_->call_log = log;
}

uint64_t CudaBackend::measured_calls_of(Primitive p) const {
  return impl_->measured_calls[static_cast<size_t>(p)];
}

Result<CudaBackend::DeviceObservation> CudaBackend::observe() const {
  DeviceObservation o;
  size_t free_bytes = 0, total_bytes = 0;
  MEMSIM_TRY(check("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total_bytes)));
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
    MEMSIM_TRY(
        check("cudaDeviceGetGraphMemAttribute", cudaDeviceGetGraphMemAttribute(device_, attr, &v)));
    *out = v;
  }
  return o;
}

// ---- physical and virtual -------------------------------------------------------------------

Result<PhysHandle> CudaBackend::create_physical(uint64_t bytes, std::string_view tag) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(PhysHandle h, shadow_.create_physical(bytes, tag));
  const CUmemAllocationProp prop = device_prop(device_);
  CUmemGenericAllocationHandle cu = 0;
  const Status s = m.run(P::kCreatePhysical, "cuMemCreate",
                         [&] { return m.drv.cuMemCreate(&cu, bytes, &prop, 0); });
  if (!s.ok()) return m.undo(s, [&] { return shadow_.release_physical(h); });
  m.handles.insert_or_assign(h.id, HandleRec{.cu = cu});
  return h;
}

Status CudaBackend::release_physical(PhysHandle h) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_TRY(shadow_.release_physical(h));
  auto it = m.handles.find(h.id);
  if (it == m.handles.end() || !it->second.cu_live) return {};  // the shadow knew it live
  HandleRec& rec = it->second;
  const Status s =
      m.run(P::kReleasePhysical, "cuMemRelease", [&] { return m.drv.cuMemRelease(rec.cu); });
  if (!s.ok()) return orphaned(rec, s);
  rec.cu_live = false;
  if (rec.mappings == 0) m.handles.erase(it);
  return {};
}

Result<DevPtr> CudaBackend::reserve_virtual(uint64_t bytes, uint64_t align) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(DevPtr sva, shadow_.reserve_virtual(bytes, align));
  CUdeviceptr va = 0;
  const Status s = m.run(P::kReserveVirtual, "cuMemAddressReserve",
                         [&] { return m.drv.cuMemAddressReserve(&va, bytes, align, 0, 0); });
  if (!s.ok()) return m.undo(s, [&] { return shadow_.free_virtual(sva); });
  m.ranges.insert_or_assign(va, Range(sva, bytes, Kind::kReservation));
  return static_cast<DevPtr>(va);
}

Status CudaBackend::free_virtual(DevPtr va) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_TRY(shadow_.free_virtual(m.to_shadow(va)));
  return m.drop_range(va, P::kFreeVirtual, "cuMemAddressFree",
                      [&](const Range& r) { return m.drv.cuMemAddressFree(va, r.size); });
}

// ---- mapping --------------------------------------------------------------------------------

Status CudaBackend::map(DevPtr va, uint64_t bytes, PhysHandle h, uint64_t offset) {
  MEMSIM_CUDA_ENTER();
  auto [base, range] = m.find_range(va);
  const DevPtr sva = m.to_shadow(va);
  MEMSIM_TRY(shadow_.map(sva, bytes, h, offset));
  auto hit = m.handles.find(h.id);
  Status s = make_error(ErrorCode::kInvalidState, "map: backend tables out of step with shadow");
  if (range != nullptr && hit != m.handles.end())  // always, as the shadow accepted
    s = m.run(P::kMap, "cuMemMap",
              [&] { return m.drv.cuMemMap(va, bytes, offset, hit->second.cu, 0); });
  if (!s.ok()) return m.undo(s, [&] { return shadow_.unmap(sva, bytes); });
  range->maps.insert_or_assign(va - base, MapRec{.bytes = bytes, .handle = h.id});
  ++hit->second.mappings;
  return {};
}

Status CudaBackend::unmap(DevPtr va, uint64_t bytes) {
  MEMSIM_CUDA_ENTER();
  auto [base, range] = m.find_range(va);
  MEMSIM_TRY(shadow_.unmap(m.to_shadow(va), bytes));
  if (range == nullptr) return {};
  // The shadow checked [va, va+bytes) is exactly whole mappings. The driver cannot unmap part of
  // a mapping; one cuMemUnmap per mapping is always legal (timed together as one call).
  auto it = range->maps.lower_bound(va - base);
  const auto last = range->maps.lower_bound(va - base + bytes);
  // cuMemUnmap does not wait for kernels still using the range (compute-sanitizer caught a fill
  // racing its unmap): finish the device's work first, outside the timed call.
  MEMSIM_TRY(m.check("cudaDeviceSynchronize", cudaDeviceSynchronize()));
  const Status s = m.timed(P::kUnmap, [&] {
    Status r;
    while (it != last && r.ok()) {
      r = m.check("cuMemUnmap", m.drv.cuMemUnmap(base + it->first, it->second.bytes));
      if (r.ok()) m.unmap_done(*range, it++);
    }
    return r;
  });
  for (; it != last; ++it) it->second.orphan = true;  // still mapped; teardown unmaps
  return s;
}

Status CudaBackend::set_access(DevPtr va, uint64_t bytes) {
  MEMSIM_CUDA_ENTER();
  auto [base, range] = m.find_range(va);
  MEMSIM_TRY(shadow_.set_access(m.to_shadow(va), bytes));
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device_;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  MEMSIM_TRY(m.run(P::kSetAccess, "cuMemSetAccess",
                   [&] { return m.drv.cuMemSetAccess(va, bytes, &desc, 1); }));
  if (range == nullptr) return {};
  for (auto it = range->maps.lower_bound(va - base);
       it != range->maps.end() && it->first < va - base + bytes; ++it)
    it->second.access = true;
  return {};
}

// ---- plain and stream-ordered allocations ---------------------------------------------------

Result<DevPtr> CudaBackend::device_malloc(uint64_t bytes, std::string_view tag) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(DevPtr sp, shadow_.device_malloc(bytes, tag));
  void* p = nullptr;
  const Status s = m.run(P::kDeviceMalloc, "cudaMalloc", [&] { return cudaMalloc(&p, bytes); });
  if (!s.ok()) return m.undo(s, [&] { return shadow_.device_free(sp); });
  m.ranges.insert_or_assign(addr(p), Range(sp, bytes, Kind::kDevice));
  return addr(p);
}

Status CudaBackend::device_free(DevPtr p) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_TRY(shadow_.device_free(m.to_shadow(p)));
  // A device or a stream-ordered allocation: cudaFree frees both.
  return m.drop_range(p, P::kDeviceFree, "cudaFree",
                      [&](const Range&) { return cudaFree(ptr(p)); });
}

Result<DevPtr> CudaBackend::malloc_async(uint64_t bytes, StreamId stream) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  const bool in_capture = m.capturing(stream);
  MEMSIM_ASSIGN_OR_RETURN(DevPtr sp, shadow_.malloc_async(bytes, stream));
  void* p = nullptr;
  const Status s =
      m.run(P::kMallocAsync, "cudaMallocAsync", [&] { return cudaMallocAsync(&p, bytes, cs); });
  if (!s.ok()) return m.undo(s, [&] { return shadow_.free_async(sp, stream); });
  const Kind kind = in_capture ? Kind::kGraph : Kind::kAsync;
  const uint32_t key = m.capture_key(stream);
  m.ranges.insert_or_assign(addr(p), Range(sp, bytes, kind, key));
  if (in_capture) m.captures[key].allocs.push_back(addr(p));
  return addr(p);
}

Status CudaBackend::free_async(DevPtr p, StreamId stream) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  const bool in_capture = m.capturing(stream);
  MEMSIM_TRY(shadow_.free_async(m.to_shadow(p), stream));
  auto it = m.ranges.find(p);
  if (it == m.ranges.end()) return {};
  Range& r = it->second;
  const Status s = m.run(P::kFreeAsync, "cudaFreeAsync", [&] { return cudaFreeAsync(ptr(p), cs); });
  if (!s.ok()) return r.kind == Kind::kAsync ? orphaned(r, s) : s.error();  // still held
  if (in_capture) {
    if (r.kind == Kind::kGraph && r.graph == 0 && r.capture_stream == m.capture_key(stream))
      r.freed_in_graph = true;
    else
      m.captures[m.capture_key(stream)].frees_of_others.push_back(p);
  } else if (r.kind != Kind::kGraph || r.graph_destroyed) {
    m.ranges.erase(it);
  } else {
    r.live = false;
  }
  return {};
}

Result<DevPtr> CudaBackend::host_malloc_pinned(uint64_t bytes) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(DevPtr sp, shadow_.host_malloc_pinned(bytes));
  void* p = nullptr;
  const Status s =
      m.run(P::kHostMallocPinned, "cudaMallocHost", [&] { return cudaMallocHost(&p, bytes); });
  if (!s.ok()) return m.undo(s, [&] { return shadow_.host_free_pinned(sp); });
  m.ranges.insert_or_assign(addr(p), Range(sp, bytes, Kind::kPinned));
  return addr(p);
}

Status CudaBackend::host_free_pinned(DevPtr p) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_TRY(shadow_.host_free_pinned(m.to_shadow(p)));
  return m.drop_range(p, P::kHostFreePinned, "cudaFreeHost",
                      [&](const Range&) { return cudaFreeHost(ptr(p)); });
}

// ---- streams and work -----------------------------------------------------------------------

Result<StreamId> CudaBackend::create_stream() {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(StreamId s, shadow_.create_stream());
  cudaStream_t cs = nullptr;
  MEMSIM_TRY(
      check("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking)));
  m.streams.emplace(s.id, cs);
  return s;
}

Status CudaBackend::fill(DevPtr p, uint64_t bytes, uint32_t pattern, StreamId stream) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  const bool in_capture = m.capturing(stream);
  MEMSIM_TRY(shadow_.fill(m.to_shadow(p, true), bytes, pattern, stream));
  MEMSIM_TRY(m.check_access(p, bytes, in_capture, "fill"));
  return m.work(P::kFill, "FillKernel", cs, in_capture,
                [&] { return launch_fill(cs, p, bytes, pattern); });
}

Status CudaBackend::copy(DevPtr dst, DevPtr src, uint64_t bytes, StreamId stream) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  const bool in_capture = m.capturing(stream);
  MEMSIM_TRY(shadow_.copy(m.to_shadow(dst, true), m.to_shadow(src, true), bytes, stream));
  MEMSIM_TRY(m.check_access(dst, bytes, in_capture, "copy (destination)"));
  MEMSIM_TRY(m.check_access(src, bytes, in_capture, "copy (source)"));
  // cudaMemcpyDefault: device-to-device, and pinned host memory on either side (UVA).
  return m.work(P::kCopy, "cudaMemcpyAsync", cs, in_capture,
                [&] { return cudaMemcpyAsync(ptr(dst), ptr(src), bytes, cudaMemcpyDefault, cs); });
}

Result<uint64_t> CudaBackend::count_mismatches(DevPtr p, uint64_t bytes, uint32_t pattern,
                                               StreamId stream) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  if (m.capturing(stream))
    return make_error(ErrorCode::kInvalidState, "count_mismatches: the stream is capturing");
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "count_mismatches: 0 bytes");
  MEMSIM_TRY(m.check_access(p, bytes, false, "count_mismatches"));
  unsigned long long host = 0;
  MEMSIM_TRY(check("cudaMemsetAsync", cudaMemsetAsync(m.counter, 0, sizeof(host), cs)));
  MEMSIM_TRY(check("VerifyKernel", launch_verify(cs, p, bytes, pattern, m.counter)));
  MEMSIM_TRY(check("cudaMemcpyAsync",
                   cudaMemcpyAsync(&host, m.counter, sizeof(host), cudaMemcpyDeviceToHost, cs)));
  MEMSIM_TRY(check("cudaStreamSynchronize", cudaStreamSynchronize(cs)));
  return uint64_t{host};
}

Result<uint64_t> CudaBackend::native_stream(StreamId stream) const {
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, impl_->stream_of(stream));
  return reinterpret_cast<uint64_t>(cs);
}

Status CudaBackend::synchronize() {
  MEMSIM_CUDA_ENTER();
  MEMSIM_TRY(shadow_.synchronize());
  return m.run(P::kSynchronize, "cudaDeviceSynchronize", [&] { return cudaDeviceSynchronize(); });
}

Status CudaBackend::stream_wait(StreamId waiter, StreamId on) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t wait_cs, m.stream_of(waiter));
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t on_cs, m.stream_of(on));
  MEMSIM_TRY(shadow_.stream_wait(waiter, on));
  // A fork: the shadow took `waiter` into `on`'s capture; so does the driver.
  if (auto origin = shadow_.capture_origin(waiter); origin && origin->id != waiter.id)
    m.capture_member[waiter.id] = origin->id;
  return m.run(P::kStreamWait, "cudaStreamWaitEvent", [&] {
    cudaEvent_t ev = nullptr;
    cudaError_t x = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (x != cudaSuccess) return x;
    x = cudaEventRecord(ev, on_cs);
    if (x == cudaSuccess) x = cudaStreamWaitEvent(wait_cs, ev, 0);
    const cudaError_t d = cudaEventDestroy(ev);  // released once the wait no longer needs it
    return x != cudaSuccess ? x : d;
  });
}

// ---- graphs ---------------------------------------------------------------------------------

Status CudaBackend::begin_capture(StreamId stream) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  MEMSIM_TRY(shadow_.begin_capture(stream));
  // Relaxed: other threads (and cudaMalloc from a caching allocator) may run unsafe calls.
  const Status s = m.run(P::kBeginCapture, "cudaStreamBeginCapture",
                         [&] { return cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed); });
  if (!s.ok()) {
    return m.undo(s, [&]() -> Status {
      MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, shadow_.end_capture(stream));
      return shadow_.destroy_graph(g);
    });
  }
  m.captures.emplace(stream.id, GraphRec{});
  return {};
}

Result<GraphHandle> CudaBackend::end_capture(StreamId stream, GraphOptions options) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, shadow_.end_capture(stream, options));
  GraphRec rec = std::move(m.captures[stream.id]);  // present: the shadow was capturing
  m.captures.erase(stream.id);
  std::erase_if(m.capture_member, [&](const auto& kv) { return kv.second == stream.id; });
  const unsigned long long flags =
      options.auto_free_on_launch ? cudaGraphInstantiateFlagAutoFreeOnLaunch : 0;
  const char* failed = "cudaStreamEndCapture";
  const cudaError_t e = m.timed(P::kEndCapture, [&] {
    cudaError_t x = cudaStreamEndCapture(cs, &rec.graph);
    if (x != cudaSuccess) return x;
    failed = "cudaGraphInstantiateWithFlags";
    x = cudaGraphInstantiateWithFlags(&rec.exec, rec.graph, flags);
    if (x != cudaSuccess || !m.sync_for_timing) return x;
    failed = "cudaStreamSynchronize";
    return cudaStreamSynchronize(cs);
  });
  if (e != cudaSuccess && rec.exec == nullptr) {
    // No graph: the capture's allocations went with it, in the driver and in the shadow.
    if (rec.graph) (void)cudaGraphDestroy(rec.graph);
    for (DevPtr va : rec.allocs) m.ranges.erase(va);
    return m.undo(check(failed, e), [&] { return shadow_.destroy_graph(g); });
  }
  for (DevPtr va : rec.allocs)
    if (auto it = m.ranges.find(va); it != m.ranges.end()) it->second.graph = g.id;
  m.graphs.insert_or_assign(g.id, std::move(rec));
  MEMSIM_TRY(check(failed, e));  // only the timing sync failed: the graph exists
  return g;
}

Status CudaBackend::launch(GraphHandle g, StreamId stream) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  MEMSIM_TRY(shadow_.launch(g, stream));
  auto it = m.graphs.find(g.id);
  if (it == m.graphs.end()) return {};
  bool issued = false;
  Status s = m.work(
      P::kLaunch, "cudaGraphLaunch", cs, false,
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

Status CudaBackend::upload(GraphHandle g, StreamId stream) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_ASSIGN_OR_RETURN(cudaStream_t cs, m.stream_of(stream));
  MEMSIM_TRY(shadow_.upload(g, stream));
  auto it = m.graphs.find(g.id);
  if (it == m.graphs.end()) return {};
  return m.work(P::kUpload, "cudaGraphUpload", cs, false,
                [&] { return cudaGraphUpload(it->second.exec, cs); });
}

Status CudaBackend::destroy_graph(GraphHandle g) {
  MEMSIM_CUDA_ENTER();
  MEMSIM_TRY(shadow_.destroy_graph(g));
  auto it = m.graphs.find(g.id);
  if (it == m.graphs.end()) return {};
  if (const Status s = m.destroy_real_graph(it->second); !s.ok()) return orphaned(it->second, s);
  m.graph_gone(it->second);
  m.graphs.erase(it);
  return {};
}

Status CudaBackend::graph_mem_trim() {
  MEMSIM_CUDA_ENTER();
  MEMSIM_TRY(shadow_.graph_mem_trim());
  return m.run(P::kGraphMemTrim, "cudaDeviceGraphMemTrim",
               [&] { return cudaDeviceGraphMemTrim(device_); });
}

}  // namespace memsim
