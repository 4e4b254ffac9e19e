// Model-step kernels: RMSNorm (fused residual add, per-head q/k norm), rotary embedding,
// SiLU-and-mul, embedding gather, row gather and greedy argmax. One warp per row where rows are
// short (norms, argmax over a row), one thread per element pair elsewhere.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "kernels/model_ops.h"

namespace memsim::kernels {
namespace {

__device__ __forceinline__ float to_f(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_f(__half x) {
  return __half2float(x);
}
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

template <class F>
cudaError_t by_dtype(KvDtype dtype, F&& f) {
  return dtype == KvDtype::kBf16 ? f.template operator()<__nv_bfloat16>()
                                 : f.template operator()<__half>();
}

bool aligned16(uint64_t v) {
  return v % 16 == 0;
}

unsigned grid_for(uint64_t items, unsigned per_block, unsigned cap = 65535u * 16) {
  return static_cast<unsigned>(std::clamp<uint64_t>((items + per_block - 1) / per_block, 1, cap));
}

// ---- RMSNorm ----------------------------------------------------------------------------------

template <typename T>
struct RmsNormParams {
  const T* x;
  T* out;
  T* residual;  // null: plain norm
  const T* weight;
  uint32_t tokens, heads, dim;
  uint64_t token_stride;
  float eps;
};

constexpr int kNormThreads = 256;
constexpr int kNormVecs = 4;  // 16-byte vectors a thread keeps in registers: dim <= R x 32

// Rows held in registers, 16-byte loads: R threads per row (32: a warp a row, for per-head norms;
// 256: a CTA a row, for hidden rows), each with up to kNormVecs vectors of 8 elements. One read
// of x (and residual), one write of residual and out: no re-read after a store, so aliasing of
// x, out and residual costs nothing.
template <typename T, int R>
__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const __grid_constant__ RmsNormParams<T> p) {
  constexpr int kRowsPerCta = kNormThreads / R;
  const uint64_t rows = uint64_t{p.tokens} * p.heads;
  const uint64_t r = uint64_t{blockIdx.x} * kRowsPerCta + threadIdx.x / R;
  const uint32_t lane = threadIdx.x % R;
  const uint32_t nvec = p.dim / 8;
  const bool live = r < rows;
  const uint64_t base = live ? (r / p.heads) * p.token_stride + (r % p.heads) * p.dim : 0;
  float v[kNormVecs][8];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kNormVecs; ++k) {
    const uint32_t j = lane + k * R;
    if (!live || j >= nvec) continue;
    uint4 raw = *reinterpret_cast<const uint4*>(p.x + base + j * 8);
    const T* e = reinterpret_cast<const T*>(&raw);
    if (p.residual) {
      uint4 res = *reinterpret_cast<const uint4*>(p.residual + base + j * 8);
      T* f = reinterpret_cast<T*>(&res);
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = from_f<T>(to_f(e[i]) + to_f(f[i]));
      *reinterpret_cast<uint4*>(p.residual + base + j * 8) = res;
      raw = res;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[k][i] = to_f(e[i]);
      ss += v[k][i] * v[k][i];
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if constexpr (R > 32) {
    __shared__ float part[kNormThreads / 32];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    ss = 0;
#pragma unroll
    for (int w = 0; w < kNormThreads / 32; ++w) ss += part[w];
  }
  if (!live) return;
  const float inv = rsqrtf(ss / static_cast<float>(p.dim) + p.eps);
#pragma unroll
  for (int k = 0; k < kNormVecs; ++k) {
    const uint32_t j = lane + k * R;
    if (j >= nvec) continue;
    const uint4 wraw = *reinterpret_cast<const uint4*>(p.weight + j * 8);
    const T* w = reinterpret_cast<const T*>(&wraw);
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = from_f<T>(to_f(from_f<T>(v[k][i] * inv)) * to_f(w[i]));
    *reinterpret_cast<uint4*>(p.out + base + j * 8) = out;
  }
}

// ---- rotary embedding --------------------------------------------------------------------------

template <typename T>
struct RopeParams {
  T* qkv;
  T* q_out;
  const int32_t* positions;
  const float* inv_freq;
  uint32_t tokens, q_heads, kv_heads, head_dim;
};

// One thread per (token, head, pair i < head_dim / 2); heads [0, q_heads) are q, the next
// kv_heads are k.
template <typename T>
__global__ void RopeKernel(const __grid_constant__ RopeParams<T> p) {
  const uint32_t half = p.head_dim / 2;
  const uint32_t heads = p.q_heads + p.kv_heads;
  const uint64_t n = uint64_t{p.tokens} * heads * half;
  const uint64_t row = uint64_t{p.q_heads + 2 * p.kv_heads} * p.head_dim;
  for (uint64_t idx = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < n;
       idx += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t i = static_cast<uint32_t>(idx % half);
    const uint32_t h = static_cast<uint32_t>((idx / half) % heads);
    const uint64_t t = idx / (uint64_t{half} * heads);
    float s, c;
    sincosf(static_cast<float>(p.positions[t]) * p.inv_freq[i], &s, &c);
    const T* in = p.qkv + t * row + uint64_t{h} * p.head_dim;
    const float x0 = to_f(in[i]), x1 = to_f(in[i + half]);
    T* out = h < p.q_heads ? p.q_out + (t * p.q_heads + h) * p.head_dim
                           : p.qkv + t * row + uint64_t{h} * p.head_dim;
    out[i] = from_f<T>(x0 * c - x1 * s);
    out[i + half] = from_f<T>(x1 * c + x0 * s);
  }
}

// ---- SiLU and mul, gathers ---------------------------------------------------------------------

template <typename T>
struct SiluMulParams {
  const T* gate_up;
  T* out;
  uint32_t tokens, inter;
};

// 8 elements a thread (16-byte loads and stores) when inter is a multiple of 8, else 1.
template <typename T, int V>
__global__ void SiluMulKernel(const __grid_constant__ SiluMulParams<T> p) {
  const uint64_t groups = p.inter / V;
  const uint64_t n = uint64_t{p.tokens} * groups;
  for (uint64_t idx = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < n;
       idx += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t t = idx / groups, j = (idx % groups) * V;
    T g[V], u[V], o[V];
    const T* row = p.gate_up + t * 2 * p.inter;
    if constexpr (V == 8) {
      *reinterpret_cast<uint4*>(g) = *reinterpret_cast<const uint4*>(row + j);
      *reinterpret_cast<uint4*>(u) = *reinterpret_cast<const uint4*>(row + p.inter + j);
    } else {
      g[0] = row[j];
      u[0] = row[p.inter + j];
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float x = to_f(g[i]);
      o[i] = from_f<T>(to_f(from_f<T>(x / (1.0f + expf(-x)))) * to_f(u[i]));
    }
    if constexpr (V == 8)
      *reinterpret_cast<uint4*>(p.out + t * p.inter + j) = *reinterpret_cast<const uint4*>(o);
    else
      p.out[t * p.inter + j] = o[0];
  }
}

struct GatherParams {
  const uint4* src;
  uint4* dst;
  const int32_t* rows;
  uint32_t tokens, row_vecs;  // 16-byte vectors per row
  uint32_t limit;             // rows[t] - first < limit (0: unchecked)
  int32_t first;              // the table's first row id (a vocabulary shard's start)
};

// dst row t = src row rows[t] - first, 16 bytes a thread; an out-of-range id writes zeros (vLLM's
// masked lookup of a vocabulary-parallel embedding shard).
__global__ void GatherRowsKernel(const __grid_constant__ GatherParams p) {
  const uint64_t n = uint64_t{p.tokens} * p.row_vecs;
  for (uint64_t idx = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < n;
       idx += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t t = idx / p.row_vecs, j = idx % p.row_vecs;
    const int32_t r = p.rows[t] - p.first;
    const bool ok = r >= 0 && (p.limit == 0 || static_cast<uint32_t>(r) < p.limit);
    p.dst[idx] = ok ? p.src[uint64_t(r) * p.row_vecs + j] : make_uint4(0, 0, 0, 0);
  }
}

// ---- greedy sampling ---------------------------------------------------------------------------

template <typename T>
struct ArgmaxParams {
  const T* logits;
  uint32_t rows, vocab;
  uint64_t stride;
  int32_t* ids;
};

constexpr int kArgmaxThreads = 512;

__device__ __forceinline__ bool better(float v, uint32_t i, float bv, uint32_t bi) {
  return v > bv || (v == bv && i < bi);
}

// One CTA per row: per-thread best, then warp and CTA reductions keeping the lowest index.
template <typename T>
__global__ void __launch_bounds__(kArgmaxThreads)
    ArgmaxKernel(const __grid_constant__ ArgmaxParams<T> p) {
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ uint32_t si[kArgmaxThreads / 32];
  const T* row = p.logits + uint64_t{blockIdx.x} * p.stride;
  float bv = -FLT_MAX;
  uint32_t bi = UINT32_MAX;
  for (uint32_t i = threadIdx.x; i < p.vocab; i += blockDim.x) {
    const float v = to_f(row[i]);
    if (better(v, i, bv, bi)) bv = v, bi = i;
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const uint32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  if (threadIdx.x % 32 == 0) sv[threadIdx.x / 32] = bv, si[threadIdx.x / 32] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w)
      if (better(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
    p.ids[blockIdx.x] = static_cast<int32_t>(bi);
  }
}

}  // namespace

cudaError_t rms_norm(KvDtype dtype, const RmsNormArgs& a, cudaStream_t stream) {
  const uint64_t rows = uint64_t{a.tokens} * a.heads;
  if (rows == 0) return cudaSuccess;
  if (!a.x || !a.out || !a.weight || a.dim == 0 || (a.residual && a.heads != 1))
    return cudaErrorInvalidValue;
  const uint64_t stride = a.token_stride ? a.token_stride : uint64_t{a.heads} * a.dim;
  if (stride < uint64_t{a.heads} * a.dim) return cudaErrorInvalidValue;
  // 16-byte rows held in registers: dim a multiple of 8 up to 256 x 32, aligned rows.
  if (a.dim % 8 || stride % 8 || a.dim > kNormThreads * kNormVecs * 8 || !aligned16(a.x) ||
      !aligned16(a.out) || !aligned16(a.weight) || (a.residual && !aligned16(a.residual)))
    return cudaErrorInvalidValue;
  return by_dtype(dtype, [&]<typename T>() {
    RmsNormParams<T> p{reinterpret_cast<const T*>(a.x),
                       reinterpret_cast<T*>(a.out),
                       reinterpret_cast<T*>(a.residual),
                       reinterpret_cast<const T*>(a.weight),
                       a.tokens,
                       a.heads,
                       a.dim,
                       stride,
                       a.eps};
    if (a.dim <= 32 * kNormVecs * 8) {
      constexpr int kRows = kNormThreads / 32;
      RmsNormKernel<T, 32><<<grid_for(rows, kRows, 0x7fffffffu), kNormThreads, 0, stream>>>(p);
    } else {
      RmsNormKernel<T, kNormThreads>
          <<<grid_for(rows, 1, 0x7fffffffu), kNormThreads, 0, stream>>>(p);
    }
    return cudaGetLastError();
  });
}

cudaError_t rope(KvDtype dtype, const RopeArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return cudaSuccess;
  if (!a.qkv || !a.q_out || !a.positions || !a.inv_freq || a.head_dim == 0 || a.head_dim % 2 ||
      a.q_heads == 0 || a.kv_heads == 0)
    return cudaErrorInvalidValue;
  const uint64_t n = uint64_t{a.tokens} * (a.q_heads + a.kv_heads) * (a.head_dim / 2);
  return by_dtype(dtype, [&]<typename T>() {
    RopeParams<T> p{reinterpret_cast<T*>(a.qkv),
                    reinterpret_cast<T*>(a.q_out),
                    a.positions,
                    a.inv_freq,
                    a.tokens,
                    a.q_heads,
                    a.kv_heads,
                    a.head_dim};
    RopeKernel<T><<<grid_for(n, 256), 256, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

cudaError_t silu_and_mul(KvDtype dtype, uint64_t gate_up, uint64_t out, uint32_t tokens,
                         uint32_t inter, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (!gate_up || !out || inter == 0) return cudaErrorInvalidValue;
  return by_dtype(dtype, [&]<typename T>() {
    SiluMulParams<T> p{reinterpret_cast<const T*>(gate_up), reinterpret_cast<T*>(out), tokens,
                       inter};
    if (inter % 8 == 0 && aligned16(gate_up) && aligned16(out))
      SiluMulKernel<T, 8><<<grid_for(uint64_t{tokens} * inter / 8, 256), 256, 0, stream>>>(p);
    else
      SiluMulKernel<T, 1><<<grid_for(uint64_t{tokens} * inter, 256), 256, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

namespace {
cudaError_t gather(uint64_t src, const int32_t* rows, uint64_t dst, uint32_t tokens,
                   uint64_t row_bytes, uint32_t limit, int32_t first, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (!src || !rows || !dst || row_bytes == 0 || !aligned16(src) || !aligned16(dst) ||
      !aligned16(row_bytes))
    return cudaErrorInvalidValue;
  GatherParams p{reinterpret_cast<const uint4*>(src),
                 reinterpret_cast<uint4*>(dst),
                 rows,
                 tokens,
                 static_cast<uint32_t>(row_bytes / 16),
                 limit,
                 first};
  GatherRowsKernel<<<grid_for(uint64_t{tokens} * p.row_vecs, 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}
}  // namespace

cudaError_t embedding(KvDtype dtype, uint64_t table, const int32_t* ids, uint64_t out,
                      uint32_t tokens, uint32_t dim, uint32_t vocab, cudaStream_t stream,
                      uint32_t first_id) {
  if (vocab == 0 || first_id > INT32_MAX) return cudaErrorInvalidValue;
  return gather(table, ids, out, tokens, uint64_t{dim} * dtype_bytes(dtype), vocab,
                static_cast<int32_t>(first_id), stream);
}

cudaError_t gather_rows(KvDtype dtype, uint64_t x, const int32_t* rows, uint64_t out,
                        uint32_t tokens, uint32_t dim, cudaStream_t stream) {
  return gather(x, rows, out, tokens, uint64_t{dim} * dtype_bytes(dtype), 0, 0, stream);
}

cudaError_t argmax_rows(KvDtype dtype, uint64_t logits, uint32_t rows, uint32_t vocab,
                        uint64_t stride, int32_t* ids, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!logits || !ids || vocab == 0 || stride < vocab) return cudaErrorInvalidValue;
  return by_dtype(dtype, [&]<typename T>() {
    ArgmaxParams<T> p{reinterpret_cast<const T*>(logits), rows, vocab, stride, ids};
    ArgmaxKernel<T><<<rows, kArgmaxThreads, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

}  // namespace memsim::kernels
