// A custom all-reduce over CUDA IPC buffers in the style of vLLM's (csrc/custom_all_reduce.cuh):
// every rank's kernel reads its peers' inputs directly over NVLink, one stage (each rank sums
// every input) or two (reduce-scatter into the ranks' scratch, then all-gather), with flag
// barriers in IPC-shared signal blocks. bf16 / fp16 storage, fp32 sums.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention_types.h"

namespace memsim::kernels {

inline constexpr uint32_t kCarMaxRanks = 8;    // vLLM: world sizes 2, 4, 6, 8
inline constexpr uint32_t kCarMaxBlocks = 36;  // vLLM's kMaxBlocks (and defaultBlockLimit)
inline constexpr uint32_t kCarThreads = 512;   // vLLM's threads per block

// The signal block at the start of every rank's meta buffer (vllm::Signal, the 2,560 bytes of
// ops.meta_size()): a rank writes start/end[block][its rank] in each peer's block to say it
// arrived, and counts its own calls per block in flag. Zeroed before first use. The 2-stage
// scratch (up to max_size bytes) follows it in the same buffer.
struct CarSignal {
  alignas(128) uint32_t start[kCarMaxBlocks][kCarMaxRanks];
  alignas(128) uint32_t end[kCarMaxBlocks][kCarMaxRanks];
  alignas(128) uint32_t flag[kCarMaxBlocks];
};
static_assert(sizeof(CarSignal) == 2560, "vLLM's meta_size()");

// One buffer as every rank sees it (vllm::RankData): rank r's copy at ptrs[r], opened by IPC.
struct CarRankPtrs {
  uint64_t ptrs[kCarMaxRanks];
};

struct CustomAllReduceParams {
  // Device memory holding the inputs of every rank: a graph's replays read it then, so a buffer
  // registered after the capture (vLLM's register_graph_buffers) is found there.
  const CarRankPtrs* inputs = nullptr;
  uint64_t signals[kCarMaxRanks] = {};  // every rank's meta buffer (CarSignal + scratch)
  uint64_t out = 0;                     // this rank's result (may be its own input)
  uint32_t ranks = 0, rank = 0;
  uint64_t elems = 0;  // a multiple of 8 (16 bytes); 16-byte aligned buffers
  bool two_stage = false;
};

// vLLM's choice of kernel: one stage at 2 ranks, and above 2 for inputs under 512 KiB (up to 4
// ranks) or 256 KiB (up to 8); two stages otherwise.
bool custom_all_reduce_two_stage(uint32_t ranks, uint64_t bytes);

// Enqueues the all-reduce on `stream` (capturable). Every rank must launch the same call (same
// elems, same kernel) in the same order. cudaErrorInvalidValue for a rank count other than
// 2, 4, 6, 8, unaligned buffers or an element count not a multiple of 8 (nothing launched).
cudaError_t custom_all_reduce(KvDtype dtype, const CustomAllReduceParams& params,
                              cudaStream_t stream);

}  // namespace memsim::kernels
