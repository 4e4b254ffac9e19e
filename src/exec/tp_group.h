// The collectives of a tensor-parallel group as the model step runs them (role interface), and
// the groups that implement them: NCCL, and vLLM's custom all-reduce with NCCL for the rest.
#pragma once

#include <cstdint>
#include <memory>

#include "backends/backend.h"
#include "kernels/attention_types.h"

namespace memsim {

class Nccl;

// Contract: every rank of the group calls the same collectives in the same order with the same
// sizes (the ranks run the same step); each is enqueued on `stream` (a cudaStream_t) without
// synchronizing and may be captured into a CUDA graph, whose replays then run it; the buffers are
// this rank's device memory, 16-byte aligned. rank() < size(); size() >= 1.
class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual uint32_t size() const = 0;
  virtual uint32_t rank() const = 0;
  // out = the sum over the ranks of `in`, `elems` elements of `dtype` (in == out: in place).
  virtual Status all_reduce(kernels::KvDtype dtype, DevPtr in, DevPtr out, uint64_t elems,
                            uint64_t stream) = 0;
  // out = every rank's `bytes` at `in`, rank by rank (size() x bytes).
  virtual Status all_gather(DevPtr in, DevPtr out, uint64_t bytes, uint64_t stream) = 0;
  // The largest / smallest of every rank's host `value` (up to 2^53), synchronously and outside
  // any capture: how the ranks agree on a host figure (a step's measured time, a pool's size).
  virtual Result<uint64_t> host_max(uint64_t value) = 0;
  virtual Result<uint64_t> host_min(uint64_t value) = 0;
  // Called by every rank after each CUDA graph capture whose collectives it ran, outside any
  // capture and before the graph's first replay: makes the buffers the captured collectives read
  // reachable from the peers (vLLM's register_graph_buffers). A group that needs none does
  // nothing.
  virtual Status register_graph_buffers() { return {}; }
  // Forgets every registered graph buffer and closes this rank's mappings of its peers' (local,
  // no communication). Called before the graphs' inputs are freed (their ModelStep destroyed), so
  // that a peer's later allocation at the same address can be registered again. The registered
  // buffers belong to one ModelStep at a time.
  virtual void release_graph_buffers() {}
  // What the all-reduces run on: "nccl", or "custom" (the custom all-reduce up to its size).
  virtual const char* all_reduce_kind() const = 0;
};

// A group over an initialized NCCL communicator of `size` ranks (ncclAllReduce in the model's
// dtype, ncclAllGather of bytes), as vLLM's PyNcclCommunicator runs them.
std::unique_ptr<TpGroup> make_nccl_group(Nccl& nccl, uint32_t size, uint32_t rank);

// vLLM's CustomAllreduce (vllm/distributed/device_communicators/custom_all_reduce.py with
// csrc/custom_all_reduce.cuh), over the NCCL group for the rest. At creation (collective) every
// rank cudaMallocs a meta buffer (the signal block, zeroed, and max_size of two-stage scratch), a
// data buffer (max_size) and its rank_data table (8 MiB of CarRankPtrs), and opens every peer's
// meta and data buffers by CUDA IPC. An all-reduce of a 16-byte multiple under max_size (8 MiB)
// runs kernels::custom_all_reduce: outside a capture, the input is first copied into the data
// buffer (slot 0 of rank_data); inside one, the kernel reads the input where it is, its peers'
// copies found through a rank_data slot that register_graph_buffers fills after the capture (the
// input's allocation shared by IPC, as vLLM's get_graph_buffer_ipc_meta does). An input whose
// memory cannot be shared by cudaIpc (VMM memory) is copied into the data buffer inside the
// graph instead. Larger all-reduces, all-gathers and host figures go through NCCL.
// Errors: a rank count the kernel does not take (2, 4, 6, 8), or a CUDA / NCCL failure.
Result<std::unique_ptr<TpGroup>> make_custom_all_reduce_group(Nccl& nccl, uint32_t size,
                                                              uint32_t rank);

}  // namespace memsim
