// CudaBackend: every Backend primitive on the real CUDA driver, validated and accounted by a
// SimBackend shadow; includes no CUDA header, so non-CUDA code may use it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/sim/cost_model.h"
#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "core/metrics.h"

namespace memsim {

// How it works: every primitive first runs on a SimBackend shadow built from the same GpuSpec
// (granularity and capacity replaced by the device's), with the same arguments translated to
// shadow addresses. A shadow error is returned as is and the driver is not called, so misuse
// errors, byte accounting and simulated time are those of the sim backend by construction. If the
// shadow accepts, the real call runs; if it fails, the shadow's effect is undone where an inverse
// exists (creations, maps, captures) and kDriverError "<call>: <driver error string>" returns.
// A failed release (cuMemRelease, cudaFree, unmap, ...) cannot be undone in the shadow: the
// resource stays in the backend's tables, invisible to callers, and release_everything() or the
// destructor frees it. The shadow's capacity is the device's total memory and its context term
// what was not free when the backend was created (the CUDA context, other processes' memory):
// the shadow's kOutOfMemory comes where the device runs out, to within what the driver and
// libraries take later (a cuBLASLt handle, the first cudaMalloc: 2 MiB each on H100); a real
// allocation that still fails surfaces as kDriverError (e.g. "cuMemCreate: out of memory").
//
// Strategies see real device addresses and the shadow's PhysHandle / GraphHandle ids. StreamId 0
// is a non-blocking stream the backend creates (stream capture needs a non-default stream).
// usage(), now(), time_in(), calls_of(), granularity() and capacity() come from the shadow;
// measured_time_in() / measured_calls_of() are host wall time around the real calls.
//
// Beyond the sim contract: fill/copy/count_mismatches reject (kInvalidArgument) ranges that
// are not inside one live allocation, not fully mapped with access set, or a graph allocation
// that is neither live nor being captured; and unknown stream ids. These would fault the GPU.
// copy uses cudaMemcpyDefault, so pinned host memory works on either side.
// Not thread-safe; use it from the thread that created it (its CUDA context is current there).
// A cost model with every cost zero, for tools that only want the device and measured times;
// create() replaces its capacity and granularity with the device's.
inline GpuSpec unpriced_gpu_spec(std::string name) {
  GpuSpec g;
  g.name = std::move(name);
  g.capacity = 1ull << 40;
  g.granularity = 2ull << 20;
  g.va_space = 1ull << 47;
  return g;
}

class CudaBackend final : public Backend {
 public:
  // Device state observed through the driver (not simulated).
  struct DeviceObservation {
    uint64_t free_bytes = 0, total_bytes = 0;              // cudaMemGetInfo
    uint64_t graph_used_current = 0, graph_used_high = 0;  // cudaDeviceGetGraphMemAttribute
    uint64_t graph_reserved_current = 0, graph_reserved_high = 0;
  };

  // kNotSupported when no CUDA device (or driver) is present; kDriverError on other failures.
  // `cost_model` prices the shadow; its granularity and capacity are replaced by the device's
  // (recommended VMM granularity, cudaMemGetInfo total) and its context by what is not free
  // at creation. With `sync_for_timing`, fill, copy,
  // launch and end_capture synchronize their stream (unless it is capturing) so the measured
  // time includes GPU execution. `faults` are passed to the shadow (FaultInjection).
  static Result<std::unique_ptr<CudaBackend>> create(GpuSpec cost_model, SimClock& clock,
                                                     MetricsRecorder* metrics, int device = 0,
                                                     bool sync_for_timing = false,
                                                     std::vector<FaultInjection> faults = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  uint64_t granularity() const override { return shadow_.granularity(); }
  uint64_t capacity() const override { return shadow_.capacity(); }
  // Device bytes that were not free when the backend was created (the shadow's context term).
  uint64_t context() const { return shadow_.gpu().context; }
  Result<PhysHandle> create_physical(uint64_t bytes, std::string_view tag) override;
  Status release_physical(PhysHandle h) override;
  Result<DevPtr> reserve_virtual(uint64_t bytes, uint64_t align) override;
  Status free_virtual(DevPtr va) override;
  Status map(DevPtr va, uint64_t bytes, PhysHandle h, uint64_t offset) override;
  Status unmap(DevPtr va, uint64_t bytes) override;
  Status set_access(DevPtr va, uint64_t bytes) override;
  Result<DevPtr> device_malloc(uint64_t bytes, std::string_view tag) override;
  Status device_free(DevPtr p) override;
  Result<DevPtr> malloc_async(uint64_t bytes, StreamId stream) override;
  Status free_async(DevPtr p, StreamId stream) override;
  Result<DevPtr> host_malloc_pinned(uint64_t bytes) override;
  Status host_free_pinned(DevPtr p) override;
  Result<StreamId> create_stream() override;
  Status fill(DevPtr p, uint64_t bytes, uint32_t pattern, StreamId stream) override;
  Status copy(DevPtr dst, DevPtr src, uint64_t bytes, StreamId stream) override;
  Status stream_wait(StreamId waiter, StreamId on) override;
  Status synchronize() override;  // cudaDeviceSynchronize
  Status begin_capture(StreamId stream) override;
  Result<GraphHandle> end_capture(StreamId stream, GraphOptions options = {}) override;
  Status launch(GraphHandle g, StreamId stream) override;
  Status upload(GraphHandle g, StreamId stream) override;
  Status destroy_graph(GraphHandle g) override;
  Status graph_mem_trim() override;
  // The nodes are already in the real graph (the caller enqueued them): the shadow counts them.
  Status add_captured_nodes(StreamId stream, uint64_t nodes) override {
    return shadow_.add_captured_nodes(stream, nodes);
  }
  Usage usage() const override { return shadow_.usage(); }
  SimTime now() const override { return shadow_.now(); }
  SimTime time_in(Primitive p) const override { return shadow_.time_in(p); }
  uint64_t calls_of(Primitive p) const override { return shadow_.calls_of(p); }

  // Host wall-clock nanoseconds spent in, and number of, real driver calls per primitive class
  // (including the calls release_everything() makes).
  SimTime measured_time_in(Primitive p) const;
  uint64_t measured_calls_of(Primitive p) const;
  // One real call: what the shadow priced it on (primitive, handles, bytes, graph nodes) and
  // its measured host wall time; the samples `memsim calibrate --in-context` fits.
  struct CallSample {
    SimBackend::CallFeatures features;
    SimTime measured_ns = 0;
  };
  // Appends every timed call to *log from now on (null stops).
  void record_calls(std::vector<CallSample>* log);

  Result<DeviceObservation> observe() const;
  // Number of 32-bit words of [p, p + bytes) that differ from what fill(p, bytes, pattern)
  // writes (fill_word() in kernels/fill.h). Runs VerifyKernel on `stream` and synchronizes it;
  // not allowed while the stream captures. Not a Backend primitive: the shadow is not involved.
  Result<uint64_t> count_mismatches(DevPtr p, uint64_t bytes, uint32_t pattern, StreamId stream);
  // The cudaStream_t behind `stream`, for work enqueued beside the backend's (a model step
  // captured into a strategy's graph); kInvalidArgument for an unknown stream.
  Result<uint64_t> native_stream(StreamId stream) const;

  // Releases every resource still held, once, in a safe order (graphs, async allocations, plain
  // allocations, mappings, handles, reservations, pinned host memory, graph memory trim,
  // streams), and mirrors the releases in the shadow so usage() drops to what was left. Returns
  // the first failure but keeps going. Afterwards every primitive returns kInvalidState.
  Status release_everything();

  const SimBackend& shadow() const { return shadow_; }
  int device() const { return device_; }

 private:
  struct Impl;  // driver entry points, address/handle/stream/graph tables, measured times
  CudaBackend(GpuSpec spec, SimClock& clock, MetricsRecorder* metrics,
              std::vector<FaultInjection> faults, int device);
  SimBackend shadow_;
  int device_;
  std::unique_ptr<Impl> impl_;
};

// Makes, on `device`, one of each kind of call the validation modes make (plain, pinned, VMM and
// stream-ordered memory, the fill and verify kernels, copies, a captured graph with a memory
// node), through a throwaway backend that releases everything. What the process loads lazily
// on first use (kernel modules, the driver's graph and mapping state: 4 MiB on an H100 the
// first time an RL run's saver ran) then stays loaded, so a later backend's free-memory
// observations see only the allocations it checks. Call once, before the first checked run.
Status warm_up_cuda_process(int device = 0);

}  // namespace memsim
