// Split-KV prefill's device side: a work item's chunk of its causal KV range, and the epilogue
// that writes a query row's partial output and log-sum-exp for the merge (DecodeCombineKernel).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention_core.cuh"
#include "kernels/attention_fp8.cuh"
#include "kernels/attention_types.h"

namespace memsim::kernels::detail {

// What a split prefill launch adds to PrefillParams (zero when not split). Partial row
// merge_indptr[i] + j holds query token i's attention over KV chunk j, normalized, for every
// query head: partial_o [rows, q_heads, D] and partial_lse [rows, q_heads] (log2 domain).
struct PrefillSplitView {
  float* partial_o;
  float* partial_lse;
  const int32_t* merge_indptr;  // [total_q + 1]: token i's rows, one per chunk its keys reach
  uint32_t kv_chunk;            // KV tokens per chunk, whole KV tiles

  // KV range of chunk `chunk` within the tile's range [kv_begin, kv_end): its causal range, from
  // its first query's window start with a sliding window (0 without one), as the planner cuts it
  // (split_prefill_plan).
  __device__ __forceinline__ void chunk_range(uint32_t chunk, uint32_t kv_begin, uint32_t kv_end,
                                              uint32_t* lo, uint32_t* hi) const {
    *lo = min(kv_end, kv_begin + chunk * kv_chunk);
    *hi = min(kv_end, *lo + kv_chunk);
  }
};

// The workspace of a split launch (a.split.kv_chunk > 0): partial_o [rows, q_heads, D], then
// partial_lse [rows, q_heads]; the merge indptr follows the items' three words in the work list.
inline PrefillSplitView prefill_split_view(const AttentionShape& shape, const PrefillArgs& a) {
  PrefillSplitView v{};
  v.partial_o = reinterpret_cast<float*>(a.workspace);
  v.partial_lse = v.partial_o + uint64_t{a.split.partial_rows} * shape.q_heads * shape.head_dim;
  v.merge_indptr = a.work + 3 * uint64_t{a.num_tiles};
  v.kv_chunk = a.split.kv_chunk;
  return v;
}

// The row of partial_o / partial_lse where split prefill keeps query head `qh` of token `token`
// computed over KV chunk `chunk`; kSkipRow when the token's causal range ends before the chunk
// (nothing to write), kDirectRow when the token has one chunk (this one): the caller writes its
// output directly, as the unsplit kernel does.
inline constexpr int64_t kSkipRow = -1, kDirectRow = -2;
__device__ __forceinline__ int64_t partial_row(const PrefillSplitView& s, uint32_t chunk,
                                               uint32_t token, uint32_t q_heads, uint32_t qh) {
  const int32_t first = s.merge_indptr[token];
  const uint32_t count = static_cast<uint32_t>(s.merge_indptr[token + 1] - first);
  if (chunk >= count) return kSkipRow;
  if (count == 1) return kDirectRow;
  return (static_cast<int64_t>(first) + chunk) * q_heads + qh;
}

// Writes query row r (of the thread's two) of token `token`, query head `qh`, computed over KV
// chunk `chunk`, as partial_row says: nothing, or the partial output (o x inv) and its
// log-sum-exp. Returns false when the caller writes the output directly. `l` is the row's
// quad-summed denominator, `inv` = 1 / l (x v_scale for fp8 caches).
template <int D, int DT, bool FP8>
__device__ __forceinline__ bool store_partial(const PrefillSplitView& s, const RowState<DT>& st,
                                              int r, int t, uint32_t chunk, uint32_t token,
                                              uint32_t q_heads, uint32_t qh, float l, float inv) {
  const int64_t idx = partial_row(s, chunk, token, q_heads, qh);
  if (idx < 0) return idx == kSkipRow;
  float* out = s.partial_o + idx * D;
#pragma unroll
  for (int d = 0; d < DT; ++d) {
    if constexpr (FP8) {
      out[o_col_fp8(d, t, 0)] = st.o[d][2 * r] * inv;
      out[o_col_fp8(d, t, 1)] = st.o[d][2 * r + 1] * inv;
    } else {
      *reinterpret_cast<float2*>(out + 8 * d + 2 * t) =
          make_float2(st.o[d][2 * r] * inv, st.o[d][2 * r + 1] * inv);
    }
  }
  if (t == 0) s.partial_lse[idx] = l > 0.f ? st.m[r] + __log2f(l) : -INFINITY;
  return true;
}

}  // namespace memsim::kernels::detail
