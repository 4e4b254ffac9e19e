// KvWriteKernel (vLLM reshape_and_cache), BlockCopyKernel (copy_blocks / swap_blocks) and
// ReadBandwidthKernel (the read-only bandwidth ceiling), with their host launchers.
#include <cuda_runtime.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/synth.h"

namespace memsim::kernels {
namespace {

constexpr unsigned kThreads = 128;

struct KvWriteParams {
  const uint8_t* k_new;
  const uint8_t* v_new;
  int64_t new_stride;  // bytes between tokens of k_new / v_new
  const int64_t* slots;
  uint8_t* k;
  uint8_t* v;
  int64_t slot_granule;  // slots per block (paged) or per sequence slot (contiguous)
  int64_t block_stride;  // bytes
  int64_t row;           // bytes of one token row
};

// One CTA per token; 16-byte stores of its K and V rows to the slot's row.
__global__ void __launch_bounds__(kThreads) KvWriteKernel(const __grid_constant__ KvWriteParams p) {
  const int64_t slot = p.slots[blockIdx.x];
  if (slot < 0) return;  // padding token
  const int64_t dst = (slot / p.slot_granule) * p.block_stride + (slot % p.slot_granule) * p.row;
  const int64_t src = static_cast<int64_t>(blockIdx.x) * p.new_stride;
  const auto* ks = reinterpret_cast<const uint4*>(p.k_new + src);
  const auto* vs = reinterpret_cast<const uint4*>(p.v_new + src);
  auto* kd = reinterpret_cast<uint4*>(p.k + dst);
  auto* vd = reinterpret_cast<uint4*>(p.v + dst);
  for (int64_t c = threadIdx.x; c < p.row / 16; c += blockDim.x) {
    kd[c] = ks[c];
    vd[c] = vs[c];
  }
}

// Rows of T quantized into an fp8 cache (as KvWriteParams; `row` counts bytes of the fp8 row).
struct KvWriteFp8Params {
  KvWriteParams w;
  float k_scale, v_scale;
};

// Eight elements of T (16 bytes) to eight fp8 values (8 bytes): fp8(x / scale), rounded to
// nearest even and saturated to the largest finite value (vLLM's scaled_fp8_conversion in
// csrc/quantization/fp8; __NV_SATFINITE keeps NaN a NaN). The division is IEEE-rounded (__fdiv_rn)
// so that a host reference reproduces every byte.
template <typename T, __nv_fp8_interpretation_t KIND>
__device__ __forceinline__ uint2 quantize8(uint4 in, float scale) {
  const T* x = reinterpret_cast<const T*>(&in);
  uint32_t out[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = make_float2(__fdiv_rn(static_cast<float>(x[2 * i]), scale),
                                 __fdiv_rn(static_cast<float>(x[2 * i + 1]), scale));
    const uint32_t two = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, KIND);
    out[i >> 1] |= two << (16 * (i & 1));
  }
  return make_uint2(out[0], out[1]);
}

// One CTA per token (vLLM reshape_and_cache_flash with an fp8 kv_cache_dtype): each thread
// quantizes 16 bytes of the K and V rows into 8 bytes of the slot's row.
template <typename T, __nv_fp8_interpretation_t KIND>
__global__ void __launch_bounds__(kThreads)
    KvWriteFp8Kernel(const __grid_constant__ KvWriteFp8Params q) {
  const KvWriteParams& p = q.w;
  const int64_t slot = p.slots[blockIdx.x];
  if (slot < 0) return;  // padding token
  const int64_t dst = (slot / p.slot_granule) * p.block_stride + (slot % p.slot_granule) * p.row;
  const int64_t src = static_cast<int64_t>(blockIdx.x) * p.new_stride;
  const auto* ks = reinterpret_cast<const uint4*>(p.k_new + src);
  const auto* vs = reinterpret_cast<const uint4*>(p.v_new + src);
  auto* kd = reinterpret_cast<uint2*>(p.k + dst);
  auto* vd = reinterpret_cast<uint2*>(p.v + dst);
  for (int64_t c = threadIdx.x; c < p.row / 8; c += blockDim.x) {
    kd[c] = quantize8<T, KIND>(ks[c], q.k_scale);
    vd[c] = quantize8<T, KIND>(vs[c], q.v_scale);
  }
}

struct BlockCopyParams {
  const uint8_t* src;
  uint8_t* dst;
  const uint64_t* src_regions;  // optional per-region bases
  const uint64_t* dst_regions;
  uint64_t src_region_stride, dst_region_stride;
  uint64_t src_block_stride, dst_block_stride;
  uint64_t block_bytes;
  const int64_t* pairs;
};

// Grid (pair, region): copies one block of one region with 16-byte loads and stores.
__global__ void __launch_bounds__(256) BlockCopyKernel(const __grid_constant__ BlockCopyParams p) {
  const uint64_t from = static_cast<uint64_t>(p.pairs[2 * blockIdx.x]);
  const uint64_t to = static_cast<uint64_t>(p.pairs[2 * blockIdx.x + 1]);
  const uint8_t* src_base = p.src_regions
                                ? reinterpret_cast<const uint8_t*>(p.src_regions[blockIdx.y])
                                : p.src + blockIdx.y * p.src_region_stride;
  uint8_t* dst_base = p.dst_regions ? reinterpret_cast<uint8_t*>(p.dst_regions[blockIdx.y])
                                    : p.dst + blockIdx.y * p.dst_region_stride;
  const auto* s = reinterpret_cast<const uint4*>(src_base + from * p.src_block_stride);
  auto* d = reinterpret_cast<uint4*>(dst_base + to * p.dst_block_stride);
  for (uint64_t c = threadIdx.x; c < p.block_bytes / 16; c += blockDim.x) d[c] = s[c];
}

struct ReadParams {
  const uint4* p;
  uint64_t n;  // 16-byte words
  uint32_t* sink;
};

// Grid-stride read of every word, four independent loads in flight per thread; the XOR of all
// words is written per CTA so the loads cannot be dropped.
__global__ void __launch_bounds__(512) ReadBandwidthKernel(const __grid_constant__ ReadParams p) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + 3 * stride < p.n; i += 4 * stride) {
    const uint4 a = __ldcs(p.p + i), b = __ldcs(p.p + i + stride), c = __ldcs(p.p + i + 2 * stride),
                d = __ldcs(p.p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < p.n; i += stride) {
    const uint4 a = __ldcs(p.p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(p.sink + blockIdx.x, acc);
}

struct SynthParams {
  uint16_t* out;
  const uint32_t* a;
  const uint32_t* b;
  uint32_t rows, row_elems, salt;
  bool fp16;
};

// Grid-stride over (row, element) pairs.
__global__ void __launch_bounds__(256) SynthRowsKernel(const __grid_constant__ SynthParams p) {
  const uint64_t n = uint64_t{p.rows} * p.row_elems;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t r = static_cast<uint32_t>(i / p.row_elems);
    const uint32_t e = static_cast<uint32_t>(i % p.row_elems);
    const float x = synth_value(p.a[r], p.b[r], p.salt, e);
    p.out[i] = p.fp16 ? __half_as_ushort(__float2half_rn(x))
                      : __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
}

struct RandomParams {
  uint16_t* p;
  uint64_t n;
  uint64_t seed;
  bool fp16;
  float scale, offset;
  // Element i is element first + (i / cols) x full_cols + i % cols of the whole tensor (a
  // block of rows and columns of it); cols == full_cols: a contiguous range.
  uint64_t first, cols, full_cols;
};

// Whole-tensor element g = offset + scale x (uniform in [-1, 1) from a 64-bit mix of (seed, g)),
// computed in fp32 and rounded to bf16 or fp16.
__global__ void __launch_bounds__(256) RandomHalfKernel(const __grid_constant__ RandomParams p) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < p.n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t g =
        p.first + (p.cols == p.full_cols ? i : i / p.cols * p.full_cols + i % p.cols);
    uint64_t z = p.seed + (g + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (2.f / 16777216.f) - 1.f;
    const float x = p.offset + p.scale * u;
    p.p[i] = p.fp16 ? __half_as_ushort(__float2half_rn(x))
                    : __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
}

bool aligned16(uint64_t x) {
  return x % 16 == 0;
}

}  // namespace

cudaError_t paged_kv_write(const AttentionShape& shape, const KvWriteArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return cudaSuccess;
  if (!check_shape(shape).empty() || a.slot_mapping == nullptr) return cudaErrorInvalidValue;
  const int64_t in_elem = dtype_bytes(shape.dtype), elem = shape.kv_elem_bytes();
  const int64_t row = static_cast<int64_t>(shape.row_elems()) * elem;
  const int64_t new_stride =
      (a.new_stride ? a.new_stride : static_cast<int64_t>(shape.row_elems())) * in_elem;
  const uint32_t granule =
      a.cache.addressing == KvAddressing::kPaged ? a.cache.block_size : a.slot_tokens;
  if (granule == 0 || !aligned16(a.k_new) || !aligned16(a.v_new) || !aligned16(a.cache.k) ||
      !aligned16(a.cache.v) || !aligned16(new_stride) ||
      !aligned16(static_cast<uint64_t>(a.cache.block_stride * elem)))
    return cudaErrorInvalidValue;
  KvWriteParams p{reinterpret_cast<const uint8_t*>(a.k_new),
                  reinterpret_cast<const uint8_t*>(a.v_new),
                  new_stride,
                  a.slot_mapping,
                  reinterpret_cast<uint8_t*>(a.cache.k),
                  reinterpret_cast<uint8_t*>(a.cache.v),
                  granule,
                  a.cache.block_stride * elem,
                  row};
  if (!shape.kv_fp8()) {
    KvWriteKernel<<<a.num_tokens, kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  if (!(a.kv_scales.k > 0) || !(a.kv_scales.v > 0)) return cudaErrorInvalidValue;
  const KvWriteFp8Params q{p, a.kv_scales.k, a.kv_scales.v};
  const bool e5m2 = shape.kv_cache == KvCacheDtype::kFp8E5m2;
  if (shape.dtype == KvDtype::kBf16) {
    if (e5m2)
      KvWriteFp8Kernel<__nv_bfloat16, __NV_E5M2><<<a.num_tokens, kThreads, 0, stream>>>(q);
    else
      KvWriteFp8Kernel<__nv_bfloat16, __NV_E4M3><<<a.num_tokens, kThreads, 0, stream>>>(q);
  } else {
    if (e5m2)
      KvWriteFp8Kernel<__half, __NV_E5M2><<<a.num_tokens, kThreads, 0, stream>>>(q);
    else
      KvWriteFp8Kernel<__half, __NV_E4M3><<<a.num_tokens, kThreads, 0, stream>>>(q);
  }
  return cudaGetLastError();
}

cudaError_t copy_blocks(const BlockCopyArgs& a, cudaStream_t stream) {
  if (a.num_pairs == 0 || a.regions == 0 || a.block_bytes == 0) return cudaSuccess;
  if (a.pairs == nullptr || a.regions > 65535 || (!a.src_regions && !aligned16(a.src)) ||
      (!a.dst_regions && !aligned16(a.dst)) || !aligned16(a.block_bytes) ||
      !aligned16(a.src_block_stride) || !aligned16(a.dst_block_stride) ||
      !aligned16(a.src_region_stride) || !aligned16(a.dst_region_stride))
    return cudaErrorInvalidValue;
  BlockCopyParams p{reinterpret_cast<const uint8_t*>(a.src),
                    reinterpret_cast<uint8_t*>(a.dst),
                    a.src_regions,
                    a.dst_regions,
                    a.src_region_stride,
                    a.dst_region_stride,
                    a.src_block_stride,
                    a.dst_block_stride,
                    a.block_bytes,
                    a.pairs};
  BlockCopyKernel<<<dim3(a.num_pairs, a.regions), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t read_bandwidth(uint64_t ptr, uint64_t bytes, uint32_t* sink, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!aligned16(ptr) || !aligned16(bytes) || sink == nullptr) return cudaErrorInvalidValue;
  int dev = 0, sms = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      e != cudaSuccess)
    return e;
  const uint64_t n = bytes / 16;
  const unsigned blocks = static_cast<unsigned>(
      std::clamp<uint64_t>((n + 4 * 512 - 1) / (4 * 512), 1, std::min<uint64_t>(4096, 4u * sms)));
  ReadParams p{reinterpret_cast<const uint4*>(ptr), n, sink};
  ReadBandwidthKernel<<<blocks, 512, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t random_half(KvDtype dtype, uint64_t ptr, uint64_t count, uint64_t seed,
                        cudaStream_t stream, float scale, float offset) {
  return random_half_block(dtype, ptr, {count, count, count, 0}, seed, stream, scale, offset);
}

cudaError_t random_half_block(KvDtype dtype, uint64_t ptr, const RandomBlock& block, uint64_t seed,
                              cudaStream_t stream, float scale, float offset) {
  if (block.count == 0) return cudaSuccess;
  if (ptr % 2 != 0 || block.cols == 0 || block.cols > block.full_cols ||
      block.count % block.cols != 0)
    return cudaErrorInvalidValue;
  const unsigned blocks =
      static_cast<unsigned>(std::min<uint64_t>((block.count + 255) / 256, 8192));
  RandomParams p{reinterpret_cast<uint16_t*>(ptr),
                 block.count,
                 seed,
                 dtype == KvDtype::kFp16,
                 scale,
                 offset,
                 block.first,
                 block.cols,
                 block.full_cols};
  RandomHalfKernel<<<blocks, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t synth_rows(KvDtype dtype, uint64_t out, uint32_t rows, uint32_t row_elems,
                       const uint32_t* a, const uint32_t* b, uint32_t salt, cudaStream_t stream) {
  if (rows == 0 || row_elems == 0) return cudaSuccess;
  if (out % 2 != 0 || a == nullptr || b == nullptr) return cudaErrorInvalidValue;
  const uint64_t n = uint64_t{rows} * row_elems;
  const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>((n + 255) / 256, 16384));
  SynthParams p{reinterpret_cast<uint16_t*>(out), a, b, rows, row_elems, salt,
                dtype == KvDtype::kFp16};
  SynthRowsKernel<<<blocks, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace memsim::kernels
