// Merging partial attention states by log-sum-exp (the decode combine's math), for launchers
// other than decode's: split-KV prefill merges each query token's chunks with it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention_types.h"

namespace memsim::kernels::detail {

// o[i, h] = sum_j 2^(lse[j, h] - max) partial_o[j, h] / sum_j 2^(lse[j, h] - max) over the rows
// j in [indptr[i], indptr[i + 1]) of each of `tokens` rows of o ([tokens, q_heads, head_dim], the
// shape's dtype); rows with one partial or none are left as they are (their kernel wrote them).
// partial_o [rows, q_heads, head_dim] and partial_lse [rows, q_heads] are fp32, lse in log2
// units; max_parts bounds indptr's differences.
struct MergeArgs {
  const float* partial_o = nullptr;
  const float* partial_lse = nullptr;
  uint64_t o = 0;
  const int32_t* indptr = nullptr;  // [tokens + 1], device
  uint32_t tokens = 0, max_parts = 0;
};
cudaError_t merge_states(const AttentionShape& shape, const MergeArgs& args, cudaStream_t stream);

}  // namespace memsim::kernels::detail
