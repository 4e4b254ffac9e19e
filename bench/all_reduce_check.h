// memsim-model-bench --all-reduce-check: the custom all-reduce checked and timed on every rank.
#pragma once

#include <cstdint>

#include "backends/cuda/nccl.h"

namespace memsim::bench {

// On rank `rank` of `ranks` (NCCL initialized): the custom all-reduce
// (make_custom_all_reduce_group) bit for bit against the host's fp32 sums in the kernel's order,
// eager and replayed from a CUDA graph after its inputs were rewritten, at sizes across both
// kernels and max_size; NCCL's difference from the same sums; then both timed inside CUDA graphs
// from 2 KiB to 4 MiB. Rank 0 prints the table and the GPU file's custom_all_reduce_us row. Returns
// 0 when every check passed.
int all_reduce_check(Nccl& nccl, uint32_t ranks, uint32_t rank);

}  // namespace memsim::bench
