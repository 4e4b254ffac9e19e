// warm_up_cuda_process: loads what a process loads lazily on first use (kernel modules, graph
// executables, VMM and pinned-memory driver state) so that later free-memory observations see
// only the allocations being checked.
#include "backends/cuda/cuda_backend.h"

namespace memsim {

namespace {

// One of each kind of call the validation modes make, each released before the next.
Status exercise(CudaBackend& b) {
  const uint64_t g = b.granularity();
  constexpr StreamId kS0{0};
  // Plain memory, the fill and verify kernels, a device copy.
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr p, b.device_malloc(2 * g, "warm_up"));
  MEMSIM_TRY(b.fill(p, g, 0x5a5a5a5au, kS0));
  MEMSIM_TRY(b.copy(p + g, p, g, kS0));
  MEMSIM_ASSIGN_OR_RETURN(const uint64_t wrong, b.count_mismatches(p + g, g, 0x5a5a5a5au, kS0));
  if (wrong != 0) return make_error(ErrorCode::kDriverError, "warm-up: the device copy differs");
  // Pinned host memory and a copy across PCIe.
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr host, b.host_malloc_pinned(g));
  MEMSIM_TRY(b.copy(host, p, g, kS0));
  MEMSIM_TRY(b.copy(p, host, g, kS0));
  MEMSIM_TRY(b.synchronize());
  MEMSIM_TRY(b.host_free_pinned(host));
  // VMM: a handle mapped and accessed, filled, then unmapped and released.
  MEMSIM_ASSIGN_OR_RETURN(const PhysHandle h, b.create_physical(g, "warm_up"));
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr va, b.reserve_virtual(g, 0));
  MEMSIM_TRY(b.map(va, g, h, 0));
  MEMSIM_TRY(b.set_access(va, g));
  MEMSIM_TRY(b.fill(va, g, 1, kS0));
  MEMSIM_TRY(b.synchronize());
  MEMSIM_TRY(b.unmap(va, g));
  MEMSIM_TRY(b.free_virtual(va));
  MEMSIM_TRY(b.release_physical(h));
  // A graph with a memory node and a kernel, captured, launched, destroyed, its pool trimmed.
  MEMSIM_TRY(b.begin_capture(kS0));
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr a, b.malloc_async(g, kS0));
  MEMSIM_TRY(b.fill(a, g, 2, kS0));
  MEMSIM_TRY(b.copy(p, a, g, kS0));
  MEMSIM_TRY(b.free_async(a, kS0));
  MEMSIM_ASSIGN_OR_RETURN(const GraphHandle graph, b.end_capture(kS0));
  MEMSIM_TRY(b.launch(graph, kS0));
  MEMSIM_TRY(b.synchronize());
  MEMSIM_TRY(b.destroy_graph(graph));
  MEMSIM_TRY(b.graph_mem_trim());
  // Stream-ordered memory outside a capture.
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr s, b.malloc_async(g, kS0));
  MEMSIM_TRY(b.free_async(s, kS0));
  MEMSIM_TRY(b.synchronize());
  return b.device_free(p);
}

}  // namespace

Status warm_up_cuda_process(int device) {
  SimClock clock;
  MEMSIM_ASSIGN_OR_RETURN(
      std::unique_ptr<CudaBackend> b,
      CudaBackend::create(unpriced_gpu_spec("warm_up"), clock, nullptr, device));
  const Status done = exercise(*b);
  const Status released = b->release_everything();
  return done.ok() ? released : done;
}

}  // namespace memsim
