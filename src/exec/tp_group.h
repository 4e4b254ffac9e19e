// The collectives of a tensor-parallel group as the model step runs them (role interface), and
// the NCCL group that implements them.
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
};

// A group over an initialized NCCL communicator of `size` ranks (ncclAllReduce in the model's
// dtype, ncclAllGather of bytes), as vLLM's PyNcclCommunicator runs them.
std::unique_ptr<TpGroup> make_nccl_group(Nccl& nccl, uint32_t size, uint32_t rank);

}  // namespace memsim
