// The Backend contract: the narrow set of device primitives every strategy calls, implemented
// exactly by SimBackend (accounting + cost model) and on hardware by CudaBackend.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "backends/result.h"
#include "core/time.h"

namespace memsim {

using DevPtr = uint64_t;  // a device virtual address; 0 is never a valid allocation

struct PhysHandle {
  uint64_t id = 0;
  friend bool operator==(PhysHandle, PhysHandle) = default;
};
struct StreamId {
  uint32_t id = 0;  // 0 is the default stream
  friend auto operator<=>(StreamId, StreamId) = default;
};
struct GraphHandle {
  uint64_t id = 0;
  friend bool operator==(GraphHandle, GraphHandle) = default;
};
// How end_capture instantiates a graph.
struct GraphOptions {
  // cudaGraphInstantiateFlagAutoFreeOnLaunch: a launch frees the allocations the previous one
  // left live. Without it a graph with live allocations refuses to launch again.
  bool auto_free_on_launch = true;
};

// The primitive classes the cost model prices and the CUDA backend times.
enum class Primitive : uint8_t {
  kCreatePhysical,
  kReleasePhysical,
  kReserveVirtual,
  kFreeVirtual,
  kMap,
  kUnmap,
  kSetAccess,
  kDeviceMalloc,
  kDeviceFree,
  kMallocAsync,
  kFreeAsync,
  kHostMallocPinned,
  kHostFreePinned,
  kFill,
  kCopy,
  kBeginCapture,
  kEndCapture,  // capture end + instantiate
  kLaunch,
  kDestroyGraph,
  kGraphMemTrim,
  kUpload,       // cudaGraphUpload
  kStreamWait,   // an event recorded on one stream and waited on by another
  kSynchronize,  // cudaDeviceSynchronize
  kCount,
};
const char* to_string(Primitive p);
// The primitive to_string() names `name`, or kCount when none does.
Primitive primitive_named(std::string_view name);

// Memory the backend holds right now. Physical bytes count each physical allocation once,
// however many virtual ranges map it. Tags are the caller's labels ("graph_pool", "inputs", ...).
struct Usage {
  uint64_t physical_bytes = 0;      // VMM handles + device_malloc + graph memory (reserved)
  uint64_t virtual_reserved = 0;    // reserve_virtual ranges
  uint64_t virtual_mapped = 0;      // bytes of VA currently mapped to physical memory
  uint64_t graph_mem_reserved = 0;  // physical memory the driver holds for graph memory nodes
  uint64_t graph_mem_used = 0;      // of that, bytes backing live graph allocations
  uint64_t pinned_host_bytes = 0;
  // Unified memory only: bytes device_malloc reserved whose pages nothing has written yet (they
  // hold no physical memory until first touched); 0 on a discrete GPU.
  uint64_t untouched_bytes = 0;
  std::map<std::string, uint64_t, std::less<>> per_tag;  // physical bytes per tag
};

// Contract (every implementation):
// - Sizes: create_physical takes a non-zero multiple of granularity(); map/unmap/set_access
//   ranges are granularity-aligned; violations return kInvalidArgument. map maps a whole handle
//   from offset 0 (as cuMemMap requires); a partial mapping returns kNotSupported.
// - Misuse (double release, release of a mapped handle, unmap of an unmapped range, map over a
//   mapped range, free of an unknown pointer, capture calls out of order) returns
//   kInvalidState or kInvalidArgument and changes nothing. No call aborts the process.
// - Physical memory is bounded by the device capacity; exhaustion returns kOutOfMemory with
//   bytes_short set. VA space is bounded too.
// - Allocations made with malloc_async inside a capture become graph memory nodes: their address
//   is fixed at capture, physical memory is attached when the graph is launched and may be shared
//   with other graphs that cannot run at the same time (driver-managed aliasing).
// - stream_wait orders streams. During a capture a stream that waits on a capturing one joins
//   its capture (fork) and must be waited on by the capture's origin before end_capture (join).
// - Every call advances now() by its cost (SimBackend: cost model; CudaBackend: measured).
// - After any failure, destroying the backend releases every resource it still holds once.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // physical
  virtual uint64_t granularity() const = 0;
  virtual uint64_t capacity() const = 0;
  virtual Result<PhysHandle> create_physical(uint64_t bytes, std::string_view tag) = 0;
  virtual Status release_physical(PhysHandle h) = 0;

  // virtual
  virtual Result<DevPtr> reserve_virtual(uint64_t bytes, uint64_t align) = 0;
  virtual Status free_virtual(DevPtr va) = 0;

  // mapping
  virtual Status map(DevPtr va, uint64_t bytes, PhysHandle h, uint64_t offset) = 0;
  virtual Status unmap(DevPtr va, uint64_t bytes) = 0;
  virtual Status set_access(DevPtr va, uint64_t bytes) = 0;

  // plain and stream-ordered allocations
  virtual Result<DevPtr> device_malloc(uint64_t bytes, std::string_view tag) = 0;
  virtual Status device_free(DevPtr p) = 0;
  virtual Result<DevPtr> malloc_async(uint64_t bytes, StreamId stream) = 0;
  virtual Status free_async(DevPtr p, StreamId stream) = 0;
  virtual Result<DevPtr> host_malloc_pinned(uint64_t bytes) = 0;
  virtual Status host_free_pinned(DevPtr p) = 0;

  // streams and work
  virtual Result<StreamId> create_stream() = 0;
  virtual Status fill(DevPtr p, uint64_t bytes, uint32_t pattern, StreamId stream) = 0;
  virtual Status copy(DevPtr dst, DevPtr src, uint64_t bytes, StreamId stream) = 0;
  // `waiter`'s later work runs after the work enqueued on `on` so far.
  virtual Status stream_wait(StreamId waiter, StreamId on) = 0;
  // The host waits for all work on the device. kInvalidState during a capture.
  virtual Status synchronize() = 0;

  // graphs
  virtual Status begin_capture(StreamId stream) = 0;
  virtual Result<GraphHandle> end_capture(StreamId stream,  // also instantiates
                                          GraphOptions options = {}) = 0;
  virtual Status launch(GraphHandle g, StreamId stream) = 0;
  // Maps the graph's memory and uploads it now, for `stream` (cudaGraphUpload); runs nothing.
  virtual Status upload(GraphHandle g, StreamId stream) = 0;
  virtual Status destroy_graph(GraphHandle g) = 0;
  virtual Status graph_mem_trim() = 0;
  // Work the caller enqueued on `stream` itself while it captures (a model step's kernels and
  // copies, launched on the native stream beside the backend's calls): `nodes` more nodes in the
  // graph being captured, priced like the backend's own (at end_capture, and uploaded at the
  // first launch). Not a timed primitive. kInvalidState unless `stream` is capturing.
  virtual Status add_captured_nodes(StreamId stream, uint64_t nodes) = 0;

  // observe
  virtual Usage usage() const = 0;
  virtual SimTime now() const = 0;
  // Accumulated simulated (or measured) nanoseconds and call counts per primitive class.
  virtual SimTime time_in(Primitive p) const = 0;
  virtual uint64_t calls_of(Primitive p) const = 0;
};

}  // namespace memsim
