// MergeStatesKernel: merges partial attention states by log-sum-exp, one warp per (query token,
// query head) row (split-KV prefill's merge, attention_merge.h); host launcher merge_states.
#include <cuda_runtime.h>

#include "kernels/attention_core.cuh"
#include "kernels/attention_merge.h"
#include "kernels/dispatch.cuh"

namespace memsim::kernels::detail {
namespace {

constexpr int kMergeWarps = 8;  // rows per CTA

struct MergeParams {
  const float* partial_o;
  const float* partial_lse;
  uint64_t o;
  const int32_t* indptr;
  uint32_t rows, q_heads;  // rows = tokens x q_heads
};

// Grid ceil(rows / 8), 256 threads: warp w merges row (token i, head h) = w / q_heads, w % q_heads
// over its partials j in [indptr[i], indptr[i + 1]): weights 2^(lse_j - max), each lane summing
// D / 32 adjacent dims (16-byte loads where D allows) with the next partials' loads in flight.
// Rows of one partial or none are left as their kernel wrote them. (The decode combine's
// CTA-per-row reductions measured 7.0 us under ncu for 64 tokens x 32 heads x 8 partials on the
// H200; this one reads the same 8 MB without block barriers.)
template <typename T, int D>
__global__ void __launch_bounds__(32 * kMergeWarps)
    MergeStatesKernel(const __grid_constant__ MergeParams p) {
  constexpr int E = D / 32;  // dims per lane: 2, 4 or 8
  const uint32_t row = blockIdx.x * kMergeWarps + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= p.rows) return;
  const uint32_t tok = row / p.q_heads, h = row % p.q_heads;
  const int32_t first = p.indptr[tok];
  const int32_t n = p.indptr[tok + 1] - first;
  if (n <= 1) return;
  const float* lse = p.partial_lse + static_cast<int64_t>(first) * p.q_heads + h;
  float m = -INFINITY;
  for (int32_t j = static_cast<int32_t>(lane); j < n; j += 32)
    m = fmaxf(m, lse[static_cast<int64_t>(j) * p.q_heads]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float acc[E] = {}, den = 0.f;
  const float* src =
      p.partial_o + (static_cast<int64_t>(first) * p.q_heads + h) * D + static_cast<int>(lane) * E;
  const int64_t step = static_cast<int64_t>(p.q_heads) * D;
#pragma unroll 4
  for (int32_t j = 0; j < n; ++j) {
    const float l = lse[static_cast<int64_t>(j) * p.q_heads];
    const float w = m == -INFINITY || l == -INFINITY ? 0.f : exp2f(l - m);
    den += w;
    float v[E];
    if constexpr (E == 2) {
      const float2 x = *reinterpret_cast<const float2*>(src + j * step);
      v[0] = x.x;
      v[1] = x.y;
    } else {
#pragma unroll
      for (int c = 0; c < E / 4; ++c) {
        const float4 x = reinterpret_cast<const float4*>(src + j * step)[c];
        v[4 * c] = x.x;
        v[4 * c + 1] = x.y;
        v[4 * c + 2] = x.z;
        v[4 * c + 3] = x.w;
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = fmaf(w, v[e], acc[e]);
  }
  const float inv = den > 0.f ? 1.f / den : 0.f;
  uint32_t packed[E / 2];
#pragma unroll
  for (int e = 0; e < E / 2; ++e) packed[e] = Elem<T>::pack(acc[2 * e] * inv, acc[2 * e + 1] * inv);
  T* out = reinterpret_cast<T*>(p.o) + static_cast<int64_t>(row) * D + lane * E;
  if constexpr (E == 2) {
    *reinterpret_cast<uint32_t*>(out) = packed[0];
  } else if constexpr (E == 4) {
    *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
  } else {
    *reinterpret_cast<uint4*>(out) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

}  // namespace

cudaError_t merge_states(const AttentionShape& shape, const MergeArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return cudaSuccess;
  if (a.max_parts == 0 || !a.partial_o || !a.partial_lse || !a.indptr) return cudaErrorInvalidValue;
  const uint64_t rows = uint64_t{a.tokens} * shape.q_heads;
  if (rows >= (uint64_t{1} << 31)) return cudaErrorInvalidValue;
  return dispatch(shape, KvAddressing::kPaged, [&]<typename T, int D, bool>() {
    const MergeParams p{a.partial_o,  a.partial_lse, a.o, a.indptr, static_cast<uint32_t>(rows),
                        shape.q_heads};
    const auto blocks = static_cast<uint32_t>((rows + kMergeWarps - 1) / kMergeWarps);
    MergeStatesKernel<T, D><<<blocks, 32 * kMergeWarps, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

}  // namespace memsim::kernels::detail
