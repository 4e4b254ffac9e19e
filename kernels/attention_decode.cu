// PagedDecodeKernel (one query token per sequence, split-K over the KV range) and
// DecodeCombineKernel (merges the splits by log-sum-exp), with their host launcher.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <tuple>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/attention_core.cuh"
#include "kernels/attention_fp8.cuh"
#include "kernels/attention_merge.h"
#include "kernels/attention_tiles.h"
#include "kernels/dispatch.cuh"

namespace memsim::kernels {
namespace {

using detail::Tiles;

// A TMA launch's tensor maps over K and V (kv_tma_map) and the tokens of a box.
struct TmaMaps {
  CUtensorMap k, v;
  int box_rows = 0;
};

template <typename T, typename KV>
struct DecodeParams {
  detail::KvParams<T, KV> kv;
  const int32_t* num_seqs;  // optional: live batch size
  uint32_t num_splits;
  const int32_t* work;  // optional: a work list (DecodeWork's words), `capacity` rows
  uint32_t capacity;
  float* partial_o;    // [max_batch, splits, q_heads, D], with a work list [capacity, q_heads, D]
  float* partial_lse;  // [max_batch, splits, q_heads] (log2 domain), or [capacity, q_heads]
  uint32_t window;     // sliding window (0 = full): splits and chunks cover the last window only
  TmaMaps tma;         // TMA launches (fp8 caches at head_dim 128 on Hopper: decode_tma)
};

// A work list's view of chunk rows: item i covers chunk item_chunk[i] of sequence item_seq[i].
struct WorkView {
  const int32_t* w;
  uint32_t capacity;
  __device__ uint32_t num_items() const { return static_cast<uint32_t>(w[0]); }
  __device__ uint32_t chunk_tokens() const { return static_cast<uint32_t>(w[1]) * kDecodeTile; }
  __device__ uint32_t seq(uint32_t i) const { return static_cast<uint32_t>(w[2 + i]); }
  __device__ uint32_t chunk(uint32_t i) const { return static_cast<uint32_t>(w[2 + capacity + i]); }
  __device__ uint32_t first(uint32_t s) const {
    return static_cast<uint32_t>(w[2 + 2 * capacity + s]);
  }
  // Sequences past the list's batch (a captured launch's padding) have first = -1.
  __device__ bool listed(uint32_t s) const { return w[2 + 2 * capacity + s] >= 0; }
};

// Programmatic dependent launch (Hopper; FlashInfer and TensorRT-LLM launch their kernels so):
// the combine is launched as a programmatic dependent of the decode kernel, whose CTAs let it
// launch as soon as each has started (launch_dependents), so the combine's launch and CTA
// placement overlap the decode's last wave; the combine then waits (wait) until the decode grid
// has completed and its partials are visible before it reads anything.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

template <typename T, int D>
using DecodeTiles = Tiles<T, D, 1, 4, static_cast<int>(kDecodeTile)>;
// fp8 caches: 128-token tiles in two stages (an fp8 row is half a bf16 row's bytes, so a tile is
// a bf16 tile's bytes, copies and block-table fetches, in the same shared memory). Measured on an
// H100 against 64-token tiles in four stages (docs/kernels.md): 1.04x the tokens/s at 1 x 32K and
// 1.08x at 256 x 4K, paged within 3% of contiguous there. Four warps below head_dim 256; at 256
// (one CTA per SM) eight, 16 tokens of every tile each: on an H200 1.15-1.20x as fast as four
// warps over 64-token tiles in four stages, paged vs contiguous +8% -> +2..+5%; four warps over
// 128-token tiles ran 0.8x as fast (docs/results/kernels.md, 2026-11-28).
// The mma operands stay in the model's dtype (fp8 -> fp16 -> bf16 in registers): fp16 operands
// (prefill's, with Q rescaled into fp16) cut the kernel's instructions by 28% but left paged
// decode's time unchanged on an H200 and slowed contiguous decode 7-13% (docs/results/kernels.md).
template <typename T, int D>
using DecodeFp8Tiles =
    detail::Fp8Tiles<T, D, 1, (D >= 256 ? 8 : 4), 2 * static_cast<int>(kDecodeTile), 1, 2, T>;

template <typename T, typename KV, int D>
using DecodeTilesOf =
    std::conditional_t<detail::kIsFp8<KV>, DecodeFp8Tiles<T, D>, DecodeTiles<T, D>>;

// The decode kernel's launch bound (CTAs per SM; attention_tiles.h's decode_ctas_bound, which
// the planners read): 3 (one at head_dim 256); fp8 caches 2, which leaves the 128-token tile loop
// its registers (222 at head_dim 128 with Q's fragments held in them; before that, 213, and bound
// to 3 CTAs ptxas fit it in 166, which ran 0.95-0.98x as fast at 1 x 32K, 64 x 8K and 256 x 4K).
template <typename KV, int D>
inline constexpr int kDecodeMinCtas = static_cast<int>(decode_ctas_bound(D, detail::kIsFp8<KV>));

// Grid (split, kv_head, sequence), or (1, kv_head, work item) with a work list; 128 threads: the
// four warps take 16 tokens each of every 64-token KV tile (fp8 below head_dim 256: 32 of every
// 128-token tile; fp8 at 256: eight warps, 256 threads, 16 of every 128-token tile) for the
// group's query rows, then merge their softmax states in shared memory.
// Three CTAs per SM, fp8 two (shared memory allows one at head_dim 256). A CTA writes its output
// row directly when its sequence has one split (one chunk), else a partial output at row `part`
// for the combine. With a sliding window the splits (chunks) cut [window_begin, kv_len) as they
// cut [0, kv_len) without one: tiles before the window are never read, and no token needs a lower
// mask. WINDOW false: full attention, the window a compile-time 0 (the code of a kernel without
// windows).
// TMA (paged fp8 at head_dim 128, decode_tma): whole tiles come by TMA (attend_range_fp8), which
// needs the dynamic shared memory on a 1024-byte boundary (the 128-byte swizzle's period); a
// launch without it traps.
template <typename T, typename KV, int D, bool PAGED, bool WINDOW, bool TMA = false>
__global__ void __launch_bounds__(DecodeTilesOf<T, KV, D>::kThreads, (kDecodeMinCtas<KV, D>))
    PagedDecodeKernel(const __grid_constant__ DecodeParams<T, KV> p) {
  constexpr bool kFp8 = detail::kIsFp8<KV>;
  using KT = DecodeTilesOf<T, KV, D>;
  using TL = Tiles<T, D, 1, KT::kWarpsN, KT::kBN>;  // Q's layout, and K/V's unless fp8
  constexpr int kWarps = TL::kWarpsN;
  // 1024 for every instantiation: an alignment that depends on TMA is not honoured (ptxas), and
  // it costs 512 bytes of static shared memory, which leaves bf16's 3 CTAs per SM as they were.
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ float ml[kWarps][16][2];
  if constexpr (TMA) {
    if (detail::smem_addr(smem_raw) % 1024 != 0) __trap();
  }
  T* smem = reinterpret_cast<T*>(smem_raw);
  pdl_launch_dependents();  // the combine may launch; it waits for this grid to complete
  const uint32_t h = blockIdx.y;
  uint32_t seq, kv_len, b, e, part;
  bool direct;
  if (p.work) {
    const WorkView wv{p.work, p.capacity};
    const uint32_t item = blockIdx.z;
    if (item >= wv.num_items()) return;
    seq = wv.seq(item);
    if (p.num_seqs && seq >= static_cast<uint32_t>(*p.num_seqs)) return;
    kv_len = static_cast<uint32_t>(p.kv.kv_lens[seq]);
    const uint32_t wb = window_begin(kv_len, WINDOW ? p.window : 0), len = kv_len - wb;
    const uint32_t c = wv.chunk_tokens();
    b = wv.chunk(item) * c;
    if (b > 0 && b >= len) return;  // past the end: only when kv_lens differ from the plan's
    e = wb + min(len, b + c);
    b += wb;
    direct = len <= c;
    part = item;
  } else {
    const uint32_t split = blockIdx.x;
    seq = blockIdx.z;
    if (p.num_seqs && seq >= static_cast<uint32_t>(*p.num_seqs)) return;
    kv_len = static_cast<uint32_t>(p.kv.kv_lens[seq]);
    const uint32_t wb = window_begin(kv_len, WINDOW ? p.window : 0);
    split_range(kv_len - wb, static_cast<int>(kDecodeTile), p.num_splits, split, &b, &e);
    b += wb;
    e += wb;
    direct = p.num_splits == 1;
    part = seq * p.num_splits + split;
  }
  const int tid = threadIdx.x, lane = tid & 31, wn = tid >> 5;

  const int64_t q_base = (static_cast<int64_t>(seq) * p.kv.q_heads + h * p.kv.group) * D;
  detail::issue_q<TL>(
      smem, p.kv.q,
      [&](int r) -> int64_t {
        return r < static_cast<int>(p.kv.group) ? q_base + static_cast<int64_t>(r) * D : -1;
      },
      tid);
  detail::cp_async_commit();

  detail::RowState<TL::kDT> st[1];
  st[0].init();
  const uint32_t limit[1][2] = {{e, e}};
  const auto loc = detail::make_locator<PAGED, D>(p.kv, seq, h);
  if constexpr (kFp8) {
    const detail::TmaKv tma{&p.tma.k, &p.tma.v, p.tma.box_rows, static_cast<int>(h)};
    detail::attend_range_fp8<DecodeFp8Tiles<T, D>, T, KV, TMA>(
        st, smem_raw, reinterpret_cast<const uint8_t*>(p.kv.k),
        reinterpret_cast<const uint8_t*>(p.kv.v), loc, b, e, e, limit, p.kv.scale_log2, 0,
        detail::kNoWindow, &tma);
  } else {
    detail::attend_range<TL>(st, smem, p.kv.k, p.kv.v, loc, b, e, e, limit, p.kv.scale_log2);
  }

  // Merge the warps' states (shared memory is free after attend_range).
  float* mo = reinterpret_cast<float*>(smem_raw);  // [kWarps][16][D]
  static_assert(sizeof(float) * kWarps * 16 * D <= DecodeTilesOf<T, KV, D>::kSmemBytes,
                "the warps' states fit in the tiles' shared memory");
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = detail::quad_sum(st[0].l[r]);
    if (t == 0) {
      ml[wn][g + 8 * r][0] = st[0].m[r];
      ml[wn][g + 8 * r][1] = l;
    }
  }
  // Only the group's rows (the first `group` of the m-tile's 16; rows 8-15 never, group <= 8)
  // are merged, so only they are stored.
  if (g < static_cast<int>(p.kv.group)) {
#pragma unroll
    for (int d = 0; d < TL::kDT; ++d)
#pragma unroll
      for (int x = 0; x < 2; ++x)
        mo[(wn * 16 + g) * D + (kFp8 ? detail::o_col_fp8(d, t, x) : 8 * d + 2 * t + x)] =
            st[0].o[d][x];
  }
  static_assert(kMaxGroup <= 8, "the merged rows are the m-tile's first eight");
  __syncthreads();

  for (int i = tid; i < static_cast<int>(p.kv.group) * (D / 4); i += TL::kThreads) {
    const int row = i / (D / 4), c4 = i % (D / 4);
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, ml[w][row][0]);
    float l = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float sc = ml[w][row][0] == -INFINITY ? 0.f : exp2f(ml[w][row][0] - m);
      l += ml[w][row][1] * sc;
      const float4 x = *reinterpret_cast<const float4*>(mo + (w * 16 + row) * D + 4 * c4);
      acc.x += x.x * sc;
      acc.y += x.y * sc;
      acc.z += x.z * sc;
      acc.w += x.w * sc;
    }
    float inv = l > 0.f ? 1.f / l : 0.f;
    if constexpr (kFp8) inv *= p.kv.v_scale;
    const uint32_t qh = h * p.kv.group + row;
    if (direct) {
      uint2 out;
      out.x = detail::Elem<T>::pack(acc.x * inv, acc.y * inv);
      out.y = detail::Elem<T>::pack(acc.z * inv, acc.w * inv);
      *reinterpret_cast<uint2*>(p.kv.o + (static_cast<int64_t>(seq) * p.kv.q_heads + qh) * D +
                                4 * c4) = out;
    } else {
      const int64_t idx = static_cast<int64_t>(part) * p.kv.q_heads + qh;
      *reinterpret_cast<float4*>(p.partial_o + idx * D + 4 * c4) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (c4 == 0) p.partial_lse[idx] = l > 0.f ? m + __log2f(l) : -INFINITY;
    }
  }
}

template <typename T>
struct CombineParams {
  const float* partial_o;
  const float* partial_lse;
  T* o;
  const int32_t* num_seqs;
  uint32_t q_heads, num_splits;  // with a work list: the most chunks of one sequence
  const int32_t* work;           // optional: the decode's work list (`capacity` rows)
  const int32_t* kv_lens;        // with a work list: a sequence's chunks = its tiles / chunk
  uint32_t capacity;
  const int32_t* indptr;  // optional (merge_states): row i's partials [indptr[i], indptr[i + 1])
  uint32_t window;        // sliding window (0 = full): chunks cover window_len tokens
};

constexpr int kCombineThreads = 128;

// Grid (q_head, sequence), 128 threads: out = sum_s 2^lse_s o_s / sum_s 2^lse_s over the
// sequence's partials. (merge_states: grid (q_head, token), a token's partials given by an
// indptr.) One pass: each thread owns a float4 of the output row and a quarter of the splits
// (D = 128; an eighth at 64, a half at 256), loads their log-sum-exps and partial rows a batch of
// kBatch at a time (independent loads in flight, no round trip for the weights first) and merges
// them online (running max, sum and output, as the decode kernel merges tiles); the groups'
// states are then merged in shared memory.
template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads)
    DecodeCombineKernel(const __grid_constant__ CombineParams<T> p) {
  constexpr int kChunks = D / 4;                      // float4s per output row
  constexpr int kGroups = kCombineThreads / kChunks;  // split groups (2, 4 or 8)
  constexpr int kBatch = 4;                           // splits a thread loads before it merges
  __shared__ float4 part[kCombineThreads];
  __shared__ float gm[kGroups], gl[kGroups];
  pdl_wait();  // the decode grid's partials (a no-op when launched without the attribute)
  const uint32_t qh = blockIdx.x, seq = blockIdx.y;
  if (p.num_seqs && seq >= static_cast<uint32_t>(*p.num_seqs)) return;
  const int tid = threadIdx.x;
  uint32_t splits = p.num_splits, row0 = seq * p.num_splits;
  if (p.work) {  // a sequence of one chunk (or none: past the live batch) wrote its output
    const WorkView wv{p.work, p.capacity};
    const uint32_t c = wv.chunk_tokens();
    const uint32_t len = window_len(static_cast<uint32_t>(p.kv_lens[seq]), p.window);
    if (!wv.listed(seq)) return;
    splits = (len + c - 1) / c;
    if (splits <= 1) return;
    row0 = wv.first(seq);
  } else if (p.indptr) {  // rows of one partial (or none) were written by their kernel
    row0 = static_cast<uint32_t>(p.indptr[seq]);
    splits = static_cast<uint32_t>(p.indptr[seq + 1]) - row0;
    if (splits <= 1) return;
  }
  const int64_t first = static_cast<int64_t>(row0) * p.q_heads + qh;
  const int c4 = tid % kChunks, grp = tid / kChunks;

  float m = -INFINITY, l = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (uint32_t s0 = grp; s0 < splits; s0 += kBatch * kGroups) {
    float lse[kBatch];
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const uint32_t s = s0 + j * kGroups;
      const int64_t row = first + static_cast<int64_t>(s) * p.q_heads;
      lse[j] = s < splits ? p.partial_lse[row] : -INFINITY;
      v[j] = s < splits ? *reinterpret_cast<const float4*>(p.partial_o + row * D + 4 * c4)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (lse[j] == -INFINITY) continue;  // an empty split (or past the last)
      const float mn = fmaxf(m, lse[j]);
      const float a = exp2f(m - mn), b = exp2f(lse[j] - mn);  // a = 0 while m is -inf
      acc.x = acc.x * a + v[j].x * b;
      acc.y = acc.y * a + v[j].y * b;
      acc.z = acc.z * a + v[j].z * b;
      acc.w = acc.w * a + v[j].w * b;
      l = l * a + b;
      m = mn;
    }
  }
  part[tid] = acc;
  if (c4 == 0) {
    gm[grp] = m;
    gl[grp] = l;
  }
  __syncthreads();
  if (grp != 0) return;
  float mx = -INFINITY;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) mx = fmaxf(mx, gm[g]);
  float den = 0.f;
  acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if (gm[g] == -INFINITY) continue;
    const float w = exp2f(gm[g] - mx);
    const float4 x = part[g * kChunks + c4];
    den += gl[g] * w;
    acc.x += x.x * w;
    acc.y += x.y * w;
    acc.z += x.z * w;
    acc.w += x.w * w;
  }
  const float inv = den > 0.f ? 1.f / den : 0.f;
  uint2 out;
  out.x = detail::Elem<T>::pack(acc.x * inv, acc.y * inv);
  out.y = detail::Elem<T>::pack(acc.z * inv, acc.w * inv);
  *reinterpret_cast<uint2*>(p.o + (static_cast<int64_t>(seq) * p.q_heads + qh) * D + 4 * c4) = out;
}

// Launches the combine over grid (q_heads, rows); `dependent`: as a programmatic dependent of the
// kernel launched before it on `stream` (the decode kernel).
template <typename T, int D>
cudaError_t launch_combine(const CombineParams<T>& c, uint32_t rows, cudaStream_t stream,
                           bool dependent = false) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(c.q_heads, rows);
  cfg.blockDim = dim3(kCombineThreads);
  cfg.stream = stream;
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = pdl;
  cfg.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, DecodeCombineKernel<T, D>, c);
}

// cuTensorMapEncodeTiled from the driver (through the runtime: no link against libcuda), or null.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return EncodeTiled{nullptr};
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// The tokens of one TMA box of an fp8 head_dim-128 paged decode without a window, or 0 where whole
// tiles are copied by cp.async. Boxes are 64 of a block's rows, so blocks of a multiple of 64
// tokens (a whole 64-token-aligned range never crosses one). Measured on an H200
// (docs/results/kernels.md, 2026-11-29): with 64-row boxes paged decode ran 1.00-1.04x faster
// than by cp.async and -0.9..+3.3% over contiguous; a tile of 16-row boxes (vLLM's default block)
// ran 6-9% slower than cp.async, of 32-row boxes no faster; contiguous decode (one 128-row box a
// tile) took the same time either way, so it keeps cp.async. Also cp.async: devices before
// Hopper, strides TMA cannot take (2^40 bytes or more), MEMSIM_DECODE_TMA=0 (read once).
int decode_tma_rows(const AttentionShape& shape, const KvLayerView& cache, uint32_t window) {
  static const bool disabled = [] {
    const char* e = std::getenv("MEMSIM_DECODE_TMA");
    return e != nullptr && e[0] == '0';
  }();
  if (disabled || window != 0 || !shape.kv_fp8() || shape.head_dim != 128 ||
      cache.addressing != KvAddressing::kPaged || cache.block_size % 64 != 0 ||
      cache.block_stride >= (int64_t{1} << 40))
    return 0;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      major < 9 || encode_tiled() == nullptr)
    return 0;
  return 64;
}

// One layer's paged fp8 K or V (at `base`) as the 4-D byte tensor TMA reads, innermost first:
// head_dim, KV heads, a block's tokens, blocks; boxes of one KV head's `box_rows` rows in the
// 128-byte swizzle. The block extent is the largest coordinate (the block ids come from the
// tables, as the cp.async path's addresses do). L2 promotion of 128 bytes, a row: 256 bytes made
// decode 1-5% slower.
cudaError_t kv_tma_map(CUtensorMap* map, uint64_t base, const AttentionShape& shape,
                       const KvLayerView& cache, int box_rows) {
  const uint64_t d = shape.head_dim, row = d * shape.kv_heads;  // bytes
  const cuuint64_t dims[4] = {d, shape.kv_heads, cache.block_size, uint64_t{INT32_MAX}};
  const cuuint64_t strides[3] = {d, row, static_cast<uint64_t>(cache.block_stride)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(d), 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUresult r =
      encode_tiled()(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, reinterpret_cast<void*>(base), dims,
                     strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The tensor maps of a TMA launch for this shape, cache and window (false: the launch copies by
// cp.async, also when a view's extents or strides are ones TMA cannot take and encoding fails).
// Memoized per thread and view (everything the maps encode is in the key): encoding them costs
// host time on every eager launch otherwise, which per-layer launches of small batches feel.
bool decode_tma(const AttentionShape& shape, const KvLayerView& cache, uint32_t window,
                TmaMaps* out) {
  const int rows = decode_tma_rows(shape, cache, window);
  if (rows == 0) return false;
  using Key = std::tuple<uint64_t, uint64_t, int64_t, uint32_t, int, uint32_t, uint32_t>;
  thread_local std::map<Key, TmaMaps> memo;
  const Key key{cache.k,
                cache.v,
                cache.block_stride,
                cache.block_size,
                static_cast<int>(cache.addressing),
                shape.kv_heads,
                shape.head_dim};
  if (const auto it = memo.find(key); it != memo.end()) {
    *out = it->second;
    return true;
  }
  TmaMaps m;
  m.box_rows = rows;
  if (kv_tma_map(&m.k, cache.k, shape, cache, rows) != cudaSuccess ||
      kv_tma_map(&m.v, cache.v, shape, cache, rows) != cudaSuccess)
    return false;
  if (memo.size() >= 4096) memo.clear();  // a bound for processes that make many caches
  memo.emplace(key, m);
  *out = m;
  return true;
}

template <typename T, typename KV, int D, bool PAGED, bool WINDOW, bool TMA = false>
cudaError_t launch_decode(const AttentionShape& shape, const DecodePlan& plan, const DecodeArgs& a,
                          cudaStream_t stream, const TmaMaps* tma = nullptr) {
  using TL = DecodeTilesOf<T, KV, D>;
  constexpr auto kernel = PagedDecodeKernel<T, KV, D, PAGED, WINDOW, TMA>;
  if (cudaError_t e = detail::allow_smem<kernel>(TL::kSmemBytes); e != cudaSuccess) return e;
  DecodeParams<T, KV> p{};
  p.kv = detail::make_kv_params<T, KV>(shape, a.q, a.o, a.cache, a.seqs, a.scale, a.kv_scales);
  p.num_seqs = a.seqs.num_seqs;
  p.num_splits = plan.num_splits;
  p.work = plan.work_capacity ? a.work : nullptr;
  p.capacity = plan.work_capacity;
  p.window = a.window;
  if constexpr (TMA) p.tma = *tma;
  const uint64_t rows =
      plan.work_capacity ? plan.work_capacity : uint64_t{plan.max_batch} * plan.num_splits;
  p.partial_o = reinterpret_cast<float*>(a.workspace);
  p.partial_lse = p.partial_o + rows * shape.q_heads * D;
  const dim3 grid = plan.work_capacity ? dim3(1, shape.kv_heads, plan.work_capacity)
                                       : dim3(plan.num_splits, shape.kv_heads, plan.max_batch);
  kernel<<<grid, TL::kThreads, TL::kSmemBytes, stream>>>(p);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (plan.num_splits > 1) {
    CombineParams<T> c{p.partial_o,        p.partial_lse,   p.kv.o,  p.num_seqs,
                       shape.q_heads,      plan.num_splits, p.work,  p.kv.kv_lens,
                       plan.work_capacity, nullptr,         a.window};
    return launch_combine<T, D>(c, plan.max_batch, stream, /*dependent=*/true);
  }
  return cudaGetLastError();
}

}  // namespace

namespace detail {

cudaError_t merge_states(const AttentionShape& shape, const MergeArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return cudaSuccess;
  if (a.tokens > 65535 || a.max_parts == 0 || !a.partial_o || !a.partial_lse || !a.indptr)
    return cudaErrorInvalidValue;
  return dispatch(shape, KvAddressing::kPaged, [&]<typename T, int D, bool>() {
    const CombineParams<T> c{a.partial_o,
                             a.partial_lse,
                             reinterpret_cast<T*>(a.o),
                             nullptr,
                             shape.q_heads,
                             a.max_parts,
                             nullptr,
                             nullptr,
                             0,
                             a.indptr,
                             0};
    return launch_combine<T, D>(c, a.tokens, stream);
  });
}

}  // namespace detail

bool decode_uses_tma(const AttentionShape& shape, const KvLayerView& cache, uint32_t window) {
  TmaMaps maps;
  return decode_tma(shape, cache, window, &maps);
}

cudaError_t paged_decode(const AttentionShape& shape, const DecodePlan& plan,
                         const DecodeArgs& args, cudaStream_t stream) {
  if (plan.max_batch == 0) return cudaSuccess;
  if (plan.num_splits == 0 || plan.kv_tile != kDecodeTile || plan.max_batch > 65535 ||
      plan.work_capacity > 65535 || (plan.num_splits > 1 && args.workspace == 0) ||
      (plan.work_capacity > 0 && args.work == nullptr))
    return cudaErrorInvalidValue;
  if (!detail::tables_match(args.cache, args.seqs) || !detail::fp8_cache_aligned(shape, args.cache))
    return cudaErrorInvalidValue;
  return detail::dispatch_kv(
      shape, args.cache.addressing, [&]<typename T, typename KV, int D, bool PAGED>() {
        if constexpr (detail::kIsFp8<KV> && D == 128 && PAGED) {
          if (TmaMaps maps; decode_tma(shape, args.cache, args.window, &maps))
            return launch_decode<T, KV, D, PAGED, false, true>(shape, plan, args, stream, &maps);
        }
        return args.window ? launch_decode<T, KV, D, PAGED, true>(shape, plan, args, stream)
                           : launch_decode<T, KV, D, PAGED, false>(shape, plan, args, stream);
      });
}

cudaError_t query_device(DeviceLimits* out) {
  int dev = 0, sms = 0, ctas = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      e != cudaSuccess)
    return e;
  using TL = DecodeTiles<__nv_bfloat16, 128>;
  constexpr auto kernel = PagedDecodeKernel<__nv_bfloat16, __nv_bfloat16, 128, true, false>;
  if (cudaError_t e = detail::allow_smem<kernel>(TL::kSmemBytes); e != cudaSuccess) return e;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, TL::kThreads,
                                                                    TL::kSmemBytes);
      e != cudaSuccess)
    return e;
  out->num_sms = static_cast<uint32_t>(sms);
  out->decode_ctas_per_sm = static_cast<uint32_t>(ctas > 0 ? ctas : 1);
  out->prefill_sm90 = prefill_sm90_eligible({32, 8, 128, KvDtype::kBf16}, true);
  return cudaSuccess;
}

}  // namespace memsim::kernels
