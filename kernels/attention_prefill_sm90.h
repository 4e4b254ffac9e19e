// The Hopper prefill kernel's launcher (kernels/attention_prefill_sm90.cu, built for sm_90a):
// paged_prefill hands it the launches prefill_sm90_eligible (attention.h) accepts.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention_types.h"

namespace memsim::kernels {

// Causal prefill of bf16/fp16 Q over a K/V cache of Q's dtype or fp8 (e4m3/e5m2 with per-tensor
// scales, converted to Q's dtype in shared memory) at head_dim 128 (sliding window allowed),
// paged or contiguous; split launches (args.split.kv_chunk > 0) write the partial rows that
// paged_prefill's merge then reduces. Arguments as checked by paged_prefill.
cudaError_t paged_prefill_sm90(const AttentionShape& shape, const PrefillArgs& args,
                               cudaStream_t stream);

}  // namespace memsim::kernels
