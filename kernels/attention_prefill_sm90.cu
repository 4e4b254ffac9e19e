// PrefillSm90Kernel: the paged causal prefill on Hopper (sm_90a, FlashAttention-3 style): one
// producer warpgroup gathers Q and the K/V tiles token by token (paged or contiguous) with
// cp.async into 128-byte-swizzled shared memory (fp8 caches: through a staging buffer, converted
// to the compute dtype by the producer), two consumer warpgroups of 64 query rows each run
// S = Q K^T and O += P V on wgmma with the softmax in registers (split-KV launches: a chunk of the
// KV range per item, written as partial rows for the merge); host launcher.
#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/attention.h"
#include "kernels/attention_core.cuh"
#include "kernels/attention_fp8.cuh"
#include "kernels/attention_prefill_sm90.h"
#include "kernels/attention_prefill_split.cuh"
#include "kernels/attention_sm90.cuh"
#include "kernels/attention_tiles.h"
#include "kernels/dispatch.cuh"

namespace memsim::kernels {
namespace {

using namespace detail::sm90;
using detail::kNoWindow;

constexpr int kD = 128;     // head dim
constexpr int kRows = 128;  // query rows of a CTA: 2 consumer warpgroups x 64 (prefill_rows)
constexpr int kBN = 128;    // KV tokens per tile
constexpr int kStages = 2;  // K/V tiles in flight
constexpr int kThreads = 384;
// Shared memory (from a 1024-byte boundary): Q, then kStages x (K, V); each tile is two halves
// of 64 dims ([half][row][64], 128-byte rows swizzled: 16-byte chunk c of row r at c ^ (r % 8)),
// the canonical 128-byte-swizzle layout wgmma reads K-major (Q, K) and MN-major (V) alike.
constexpr uint32_t kHalfBytes = kBN * 64 * 2;
constexpr uint32_t kTileBytes = 2 * kHalfBytes;
constexpr uint32_t kQBytes = kRows * kD * 2;
// Barriers: Q full, then per stage K full, V full, K empty, V empty (K and V apart: a stage's K
// is free once its Q K^T is done, a tile before its V, whose P V runs in the next iteration).
constexpr uint32_t kBarAt = kQBytes + 2 * kStages * kTileBytes;
constexpr uint32_t kBarBytes = 8 * (1 + 4 * kStages);
constexpr uint32_t kOffsAt = kBarAt + 128;  // row offsets [3][kBN]
// fp8 caches: a K or V tile's fp8 rows ([kBN][kD] bytes) land by cp.async in one of kStaging
// staging buffers after the row offsets; the producer converts each one kAhead copies later.
constexpr uint32_t kStagingAt = kOffsAt + 3 * kBN * 8;
constexpr uint32_t kStagingBytes = kBN * kD;
constexpr int kStaging = 3;
constexpr int kAhead = 2;  // copies in flight before the oldest is converted
static_assert(kAhead < kStaging, "a staging buffer is converted before it is copied into again");
template <bool FP8>
constexpr size_t kSmemBytes = kStagingAt + (FP8 ? kStaging * kStagingBytes : 0) + 1024;  // + slack
static_assert(kHalfBytes == kRows * 64 * 2, "Q halves and K/V halves share the stride");
static_assert(kBarBytes <= 128, "barriers fit before the row offsets");
static_assert(kSmemBytes<true> <= 227 * 1024, "fp8 staging fits an SM's shared memory");
static_assert(kBN == kSm90KvTile, "the split planner cuts chunks of this kernel's tiles");

template <typename T, typename KV>
struct Sm90Params {
  detail::KvParams<T, KV> kv;
  const int32_t* qo_indptr;
  const int32_t* work;  // {sequence, first token} per CTA row
  uint32_t tokens_per_tile;
  uint32_t window;  // kNoWindow: full attention
  // Split-KV launches (partial_o null when unsplit): each item is {sequence, first token, KV
  // chunk} (work_words 3, else 2) and covers its chunk of the tile's causal range.
  detail::PrefillSplitView split;
  uint32_t work_words;
};

// Byte offset of 16-byte chunk `chunk` (0..15) of row `row` in a swizzled tile.
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return (chunk >> 3) * kHalfBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// Barrier of stage s: kKFull, kVFull (the producer's 128 threads arrive through their cp.async
// copies), kKEmpty, kVEmpty (the consumers' 256 threads arrive).
enum : int { kKFull, kVFull, kKEmpty, kVEmpty };
__device__ __forceinline__ uint32_t stage_bar(uint32_t base, int which, uint32_t s) {
  return base + kBarAt + 8 * (1 + which * kStages + s);
}

// What every thread of a CTA knows about its work item (blockIdx.x) and KV head (blockIdx.y).
// (A 1-D item-major grid, every head of the longest items first, measured 371.8 TFLOP/s at 4K x
// 4K against 378.3 for this one on another H100 of the same kind: no gain, not kept.)
struct Item {
  uint32_t seq, head;
  uint32_t q0, t0, nt, rows, prefix;
  uint32_t kv_begin, kv_end, mask_from, mask_below, ntiles;
  uint32_t chunk;  // split launches: the item's KV chunk
};

// Split launches: the item's KV chunk [lo, hi) of its range [kv_begin, kv_end) (from its first
// query's window start with a window, else 0) replaces the range. Chunks are whole 64-token tiles
// of the mma.sync kernel, not always of kBN: keys at hi and past are masked as if causal (every
// row's limit is capped at hi, and mask_from with it), rows past hi zero-filled.
template <class P>
__device__ __forceinline__ void split_item(const P& p, Item& it) {
  it.chunk = static_cast<uint32_t>(p.work[3 * blockIdx.x + 2]);
  uint32_t lo, hi;
  p.split.chunk_range(it.chunk, it.kv_begin, it.kv_end, &lo, &hi);
  it.kv_begin = lo;
  it.kv_end = hi;
  it.mask_from = min(it.mask_from, hi);
  it.ntiles = (hi - lo + kBN - 1) / kBN;
}

template <class P>
__device__ __forceinline__ Item make_item(const P& p) {
  Item it;
  const uint32_t item = blockIdx.x;
  it.head = blockIdx.y;
  const int32_t seq = p.work[p.work_words * item];
  it.seq = static_cast<uint32_t>(seq);
  it.t0 = static_cast<uint32_t>(p.work[p.work_words * item + 1]);
  it.q0 = static_cast<uint32_t>(p.qo_indptr[seq]);
  const uint32_t q_len = static_cast<uint32_t>(p.qo_indptr[seq + 1]) - it.q0;
  it.prefix = static_cast<uint32_t>(p.kv.kv_lens[seq]) - q_len;
  it.nt = min(p.tokens_per_tile, q_len - it.t0);
  it.rows = it.nt * p.kv.group;
  it.kv_end = it.prefix + it.t0 + it.nt;
  it.mask_from = it.prefix + it.t0 + 1;
  const uint32_t w = p.window;
  it.kv_begin = w != kNoWindow && it.mask_from > w ? it.mask_from - w : 0;
  it.mask_below = w != kNoWindow && it.kv_end > w ? it.kv_end - w : 0;
  it.ntiles = (it.kv_end - it.kv_begin + kBN - 1) / kBN;
  it.chunk = 0;
  if (p.split.partial_o != nullptr) split_item(p, it);
  return it;
}

// One K or V tile (FULL: every row before kv_end): 8 threads a row, 16 rows a pass. A bf16/fp16
// row is two 64-dim halves of 128 bytes, each thread copying its 16 bytes of both (a warp reads 4
// rows x 128 contiguous bytes per copy) into the swizzled tile; an fp8 row (FP8) is 128 bytes, each
// thread copying its 16 into the unswizzled staging buffer ([kBN][128 bytes]). `dst` holds the
// thread's fixed part of the address (row & 7 is the same in every pass), `src` the cache base
// plus its chunk; offs[row] is the row's byte offset (< 0: past kv_end, zero-filled).
template <bool FULL, bool FP8>
__device__ __forceinline__ void copy_rows(uint32_t dst, const char* src, const int64_t* offs,
                                          int r) {
#pragma unroll
  for (int j = 0; j < kBN / 16; ++j) {
    const int64_t o = offs[16 * j + r];
    const uint32_t d = dst + j * 16 * 128;
    if constexpr (FULL) {
      cp_async_16(d, src + o);
      if constexpr (!FP8) cp_async_16(d + kHalfBytes, src + o + 128);
    } else {
      const char* g = src + (o >= 0 ? o : 0);
      cp_async_16(d, g, o >= 0);
      if constexpr (!FP8) cp_async_16(d + kHalfBytes, g + 128, o >= 0);
    }
  }
}

// fp8: converts a staged tile to T in the swizzled layout of `tile` (exact: every fp8 value is a
// bf16 and an fp16 value; the scales are applied in fp32 by the consumers). Thread (r, c) turns
// chunk c of rows 16j + r (dims 16c..16c+15) into the tile's chunks 2c and 2c + 1; threads
// c >= 4 store the odd chunk first, so the 8 threads of a row write 8 distinct bank groups.
template <typename T, typename KV>
__device__ __forceinline__ void convert_tile(unsigned char* tile, const unsigned char* staged,
                                             int r, int c) {
  const bool odd_first = c >= 4;
#pragma unroll
  for (int j = 0; j < kBN / 16; ++j) {
    const int row = 16 * j + r;
    const uint4 w = *reinterpret_cast<const uint4*>(staged + row * kD + c * 16);
    uint4 lo, hi;
    lo.x = detail::fp8x2_to<T, KV>(w.x);
    lo.y = detail::fp8x2_to<T, KV>(w.x >> 16);
    lo.z = detail::fp8x2_to<T, KV>(w.y);
    lo.w = detail::fp8x2_to<T, KV>(w.y >> 16);
    hi.x = detail::fp8x2_to<T, KV>(w.z);
    hi.y = detail::fp8x2_to<T, KV>(w.z >> 16);
    hi.z = detail::fp8x2_to<T, KV>(w.w);
    hi.w = detail::fp8x2_to<T, KV>(w.w >> 16);
    const int first = 2 * c + (odd_first ? 1 : 0), second = 2 * c + (odd_first ? 0 : 1);
    *reinterpret_cast<uint4*>(tile + swz(row, first)) = odd_first ? hi : lo;
    *reinterpret_cast<uint4*>(tile + swz(row, second)) = odd_first ? lo : hi;
  }
}

// fp8: the tile (i) and operand (which: 0 K, 1 V) of the producer's copy j, in produce's order
// K0, K1, V0, K2, V1, ..., K(n-1), V(n-2), V(n-1) for n tiles.
__device__ __forceinline__ void job_tile(uint32_t j, uint32_t n, uint32_t& i, int& which) {
  if (j == 0) {
    i = 0;
    which = 0;
  } else if (j % 2 == 1) {
    i = (j + 1) / 2;
    which = i < n ? 0 : 1;
    if (which) i = n - 1;
  } else {
    i = j / 2 - 1;
    which = 1;
  }
}

// Producer warpgroup (tid 0..127): Q once, then every K/V tile into the stage ring, tile i's K
// before tile i - 1's V (FlashAttention-3's order: K, needed first, waits only for the Q K^T two
// tiles back, not for the P V a tile back). Each thread looks up one token's row (block table) a
// tile ahead, so the table load's latency hides behind the current copies, and shares its byte
// offset through shared memory (three buffers: V reads a tile's offsets an iteration after K; one
// named barrier a tile); the copies complete on the stage's full barrier. fp8 caches: each copy
// lands in the next staging buffer (one commit group), and the one kAhead copies before it,
// complete by then, is converted into its stage, which the producer's threads then mark full.
template <typename T, typename KV, class Loc>
__device__ __forceinline__ void produce(const Sm90Params<T, KV>& p, const Item& it, const Loc& loc,
                                        unsigned char* sm, uint32_t base, int tid) {
  constexpr bool kFp8 = detail::kIsFp8<KV>;
  {
    const int chunk = tid & 15, r0 = tid >> 4;
    const uint32_t h = it.head;
#pragma unroll 4
    for (int j = 0; j < kRows / 8; ++j) {
      const int row = 8 * j + r0;
      const bool ok = row < static_cast<int>(it.rows);
      int64_t off = 0;
      if (ok) {
        const uint32_t tok = row / p.kv.group, head = row % p.kv.group;
        off = (static_cast<int64_t>(it.q0 + it.t0 + tok) * p.kv.q_heads + h * p.kv.group + head) *
                  kD +
              chunk * 8;
      }
      detail::cp_async_16(sm + swz(row, chunk), p.kv.q + off, ok);
    }
  }
  cp_async_arrive(base + kBarAt);
  int64_t* offs = reinterpret_cast<int64_t*>(sm + kOffsAt);
  const int r = tid >> 3, c = tid & 7;
  const uint32_t mine = static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
  const char* ksrc = reinterpret_cast<const char*>(p.kv.k) + c * 16;
  const char* vsrc = reinterpret_cast<const char*>(p.kv.v) + c * 16;
  uint32_t a = 0, b = 0;
  bool have = false;
  auto fetch = [&](uint32_t i) {
    const uint32_t pos = it.kv_begin + i * kBN + tid;
    have = pos < it.kv_end;
    if (have) loc.fetch(pos, a, b);
  };
  auto publish = [&](uint32_t i) {
    offs[(i % 3) * kBN + tid] = have ? loc.offset(a, b) * static_cast<int64_t>(sizeof(KV)) : -1;
  };
  // fp8: jobs = the copies issued so far. Copy j (job_tile) lands in staging buffer j % kStaging
  // and is converted kAhead copies later, its loads in flight meanwhile. A thread converts the
  // bytes it copied itself, so neither the conversion nor the buffer's reuse needs a barrier.
  uint32_t jobs = 0;
  auto convert = [&](uint32_t j) {
    uint32_t i;
    int which;
    job_tile(j, it.ntiles, i, which);
    const uint32_t s = i % kStages;
    if (i >= kStages)
      mbar_wait(stage_bar(base, which ? kVEmpty : kKEmpty, s), ((i / kStages) + 1) & 1);
    convert_tile<T, KV>(sm + kQBytes + (2 * s + which) * kTileBytes,
                        sm + kStagingAt + (j % kStaging) * kStagingBytes, r, c);
    fence_proxy_async();  // the generic-proxy stores, before the consumers' wgmma reads
    mbar_arrive(stage_bar(base, which ? kVFull : kKFull, s));
  };
  auto load_fp8 = [&](uint32_t i, int which) {
    const int64_t* o = offs + (i % 3) * kBN;
    const uint32_t d = base + kStagingAt + (jobs % kStaging) * kStagingBytes + r * kD + c * 16;
    const char* src = which ? vsrc : ksrc;
    if (it.kv_begin + (i + 1) * kBN <= it.kv_end)
      copy_rows<true, true>(d, src, o, r);
    else
      copy_rows<false, true>(d, src, o, r);
    detail::cp_async_commit();
    if (++jobs > kAhead) {
      detail::cp_async_wait<kAhead>();  // copy jobs - 1 - kAhead has landed
      convert(jobs - 1 - kAhead);
    }
  };
  // Tile i's K (which 0) or V (1) into its stage from offset buffer i % 3.
  auto load_tile = [&](uint32_t i, int which) {
    const uint32_t s = i % kStages;
    const int64_t* o = offs + (i % 3) * kBN;
    const uint32_t d = base + kQBytes + (2 * s + which) * kTileBytes + mine;
    const char* src = which ? vsrc : ksrc;
    if (i >= kStages)
      mbar_wait(stage_bar(base, which ? kVEmpty : kKEmpty, s), ((i / kStages) + 1) & 1);
    if (it.kv_begin + (i + 1) * kBN <= it.kv_end)
      copy_rows<true, false>(d, src, o, r);
    else
      copy_rows<false, false>(d, src, o, r);
    cp_async_arrive(stage_bar(base, which ? kVFull : kKFull, s));
  };
  auto load = [&](uint32_t i, int which) {
    if constexpr (kFp8)
      load_fp8(i, which);
    else
      load_tile(i, which);
  };
  fetch(0);
  publish(0);
  for (uint32_t i = 0; i < it.ntiles; ++i) {
    named_sync(1, 128);  // tile i's offsets are published; tile i - 2's copies have read theirs
    if (i + 1 < it.ntiles) fetch(i + 1);
    load(i, 0);
    if (i > 0) load(i - 1, 1);
    if (i + 1 < it.ntiles) publish(i + 1);
  }
  if (it.ntiles > 0) load(it.ntiles - 1, 1);
  detail::cp_async_wait<0>();
  if constexpr (kFp8)
    for (uint32_t j = jobs > kAhead ? jobs - kAhead : 0; j < jobs; ++j) convert(j);
}

__device__ __forceinline__ float ex2(float x) {  // 2^x, denormal results flushed to zero
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Mask and the online-softmax update of one tile's scores for a thread's two rows (g and g + 8
// of its warp's 16: accumulator elements 4j + e, e >> 1 the row, token 8j + 2t + (e & 1)). The
// row max m is kept in log2 units (scores x scale_log2), so p = 2^(s x scale - m) is one FFMA and
// one EX2. Leaves P (unnormalized, fp32) in `s` and the rescale factor of O in alpha; O is not
// touched (P x V of the previous tile may still be in flight). MASKED: the tile crosses a row's
// causal limit or window start (a separate instantiation: the compiler would otherwise predicate
// the mask's compares into every tile).
template <bool MASKED>
__device__ __forceinline__ void softmax_tile(float (&s)[64], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], uint32_t start,
                                             const uint32_t (&limit)[2], const uint32_t (&own)[2],
                                             float scale_log2, uint32_t window, int t) {
  if constexpr (MASKED) {
    // Row r sees tile columns c with lo[r] <= c < hi[r] (c = 8j + (e & 1) after the thread's 2t):
    // below its limit (its causal end, capped at a split chunk's end) and, with a window, from
    // its own causal end (`own`, uncapped) less the window.
    int hi[2], lo[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t rel = int64_t{limit[r]} - start - 2 * t;
      const int64_t first = int64_t{own[r]} - window - start - 2 * t;
      hi[r] = static_cast<int>(max(min(rel, int64_t{kBN}), int64_t{-1}));
      lo[r] =
          window == kNoWindow ? -1 : static_cast<int>(max(min(first, int64_t{kBN}), int64_t{-1}));
    }
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * j + (e & 1);
        if (c >= hi[e >> 1] || c < lo[e >> 1]) s[4 * j + e] = -INFINITY;
      }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
  float neg_m[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m[r], mx[r] * scale_log2);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: keep zeros
    alpha[r] = ex2(m[r] - m_use);
    m[r] = m_new;
    l[r] *= alpha[r];
    neg_m[r] = -m_use;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pv = ex2(fmaf(s[4 * j + e], scale_log2, neg_m[e >> 1]));
      s[4 * j + e] = pv;
      l[e >> 1] += pv;
    }
}

// P (fp32 accumulator layout) to the A fragments of P x V: k-step kk covers tokens 16kk..+15,
// n-tiles 2kk (a0 row g, a1 row g + 8) and 2kk + 1 (a2, a3).
template <typename T>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[32], const float (&s)[64]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) pa[i] = detail::Elem<T>::pack(s[2 * i], s[2 * i + 1]);
}

__device__ __forceinline__ void rescale(float (&o)[64], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }
}

// S = Q K^T for one warpgroup (Q rows qa.., K tile at ka): 8 k-steps of 16 dims.
template <typename T>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t qa, uint32_t ka) {
  const uint64_t qd = make_desc(qa, 16, 1024), kd = make_desc(ka, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t step = (kk >> 2) * kHalfBytes + (kk & 3) * 32;
    wgmma_ss<T>(s, qd + (step >> 4), kd + (step >> 4), kk > 0);
  }
}

// O += P V (V tile at va): 8 k-steps of 16 tokens; V is MN-major (dims contiguous), its two
// 64-dim halves kHalfBytes apart (leading byte offset), 8-token groups 1024 bytes apart.
template <typename T>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[32], uint32_t va) {
  const uint64_t vd = make_desc(va, kHalfBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    const uint32_t a[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
    wgmma_rs<T>(o, a, vd + ((kk * 16 * 128) >> 4));
  }
}

// Split launches: writes row r (of the thread's two) of token `token`, query head `qh`, over the
// item's KV chunk as detail::store_partial does for the mma.sync kernel: nothing when the token's
// keys end before the chunk, the partial output (o x inv, fp32) and its log-sum-exp (log2 units,
// m the row's max) when they span several chunks. False when the token has this one chunk (the
// caller writes its output). `l` is the row's quad-summed denominator, inv = 1 / l.
__device__ __forceinline__ bool store_partial_sm90(const detail::PrefillSplitView& s,
                                                   const float (&o)[64], float m, float l,
                                                   float inv, int r, int t, uint32_t chunk,
                                                   uint32_t token, uint32_t q_heads, uint32_t qh) {
  const int64_t idx = detail::partial_row(s, chunk, token, q_heads, qh);
  if (idx < 0) return idx == detail::kSkipRow;
  float* out = s.partial_o + idx * kD;
#pragma unroll
  for (int j = 0; j < 16; ++j)
    *reinterpret_cast<float2*>(out + 8 * j + 2 * t) =
        make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
  if (t == 0) s.partial_lse[idx] = l > 0.f ? m + __log2f(l) : -INFINITY;
  return true;
}

// Consumer warpgroup `wg` (0, 1; ctid 0..255): its 64 query rows over every tile. Tile i's
// Q K^T is issued together with tile i - 1's P V, and the softmax of tile i runs while P V is in
// flight (FlashAttention-3's intra-warpgroup overlap). PINGPONG: the two warpgroups take turns
// issuing their MMAs (named barriers 2 and 3), so one's softmax runs under the other's MMAs.
template <typename T, typename KV, bool PINGPONG>
__device__ __forceinline__ void consume(const Sm90Params<T, KV>& p, const Item& it, uint32_t base,
                                        int ctid) {
  const int wg = ctid >> 7, warp = (ctid >> 5) & 3, lane = ctid & 31;
  const int g = lane >> 2, t = lane & 3;
  auto k_at = [&](uint32_t s) { return base + kQBytes + 2 * s * kTileBytes; };
  uint32_t limit[2], own[2];  // a row's causal end within the item's range, and its own
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t row = 64 * wg + 16 * warp + g + 8 * r;
    own[r] = row < it.rows ? it.prefix + it.t0 + row / p.kv.group + 1 : 0;
    limit[r] = min(own[r], it.kv_end);
  }
  const uint32_t qa = base + wg * 64 * 128;
  float o[64], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
  uint32_t pa[32];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  auto masked = [&](uint32_t start) { return start + kBN > it.mask_from || start < it.mask_below; };
  // Turns: n + 1 issue points per warpgroup; warpgroup 1 lets 0 go first and skips its last
  // arrival (nobody waits for it).
  auto my_turn = [&] {
    if constexpr (PINGPONG) named_sync(2 + wg, 256);
  };
  auto your_turn = [&](bool last) {
    if constexpr (PINGPONG)
      if (wg == 0 || !last) named_arrive(3 - wg, 256);
  };
  if (PINGPONG && wg == 1) named_arrive(2, 256);
  mbar_wait(base + kBarAt, 0);
  mbar_wait(stage_bar(base, kKFull, 0), 0);
  fence_proxy_async();
  my_turn();
  wgmma_fence();
  issue_qk<T>(s, qa, k_at(0));
  wgmma_commit();
  your_turn(false);
  wgmma_wait<0>();
  fence_regs(s);
  mbar_arrive(stage_bar(base, kKEmpty, 0));
  if (masked(it.kv_begin))
    softmax_tile<true>(s, m, l, alpha, it.kv_begin, limit, own, p.kv.scale_log2, p.window, t);
  else
    softmax_tile<false>(s, m, l, alpha, it.kv_begin, limit, own, p.kv.scale_log2, p.window, t);
  pack_p<T>(pa, s);
  for (uint32_t i = 1; i < it.ntiles; ++i) {
    const uint32_t st = i % kStages, prev = (i - 1) % kStages;
    const uint32_t start = it.kv_begin + i * kBN;
    mbar_wait(stage_bar(base, kKFull, st), (i / kStages) & 1);
    mbar_wait(stage_bar(base, kVFull, prev), ((i - 1) / kStages) & 1);
    fence_proxy_async();
    my_turn();
    wgmma_fence();
    issue_qk<T>(s, qa, k_at(st));
    wgmma_commit();
    issue_pv<T>(o, pa, k_at(prev) + kTileBytes);
    wgmma_commit();
    your_turn(false);
    wgmma_wait<1>();
    fence_regs(s);
    mbar_arrive(stage_bar(base, kKEmpty, st));
    if (masked(start))
      softmax_tile<true>(s, m, l, alpha, start, limit, own, p.kv.scale_log2, p.window, t);
    else
      softmax_tile<false>(s, m, l, alpha, start, limit, own, p.kv.scale_log2, p.window, t);
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
    mbar_arrive(stage_bar(base, kVEmpty, prev));
    rescale(o, alpha);
    pack_p<T>(pa, s);
  }
  const uint32_t last = it.ntiles - 1;
  mbar_wait(stage_bar(base, kVFull, last % kStages), (last / kStages) & 1);
  fence_proxy_async();
  my_turn();
  wgmma_fence();
  issue_pv<T>(o, pa, k_at(last % kStages) + kTileBytes);
  wgmma_commit();
  your_turn(true);
  wgmma_wait<0>();
  fence_regs(o);
  fence_regs(pa);

  const uint32_t h = it.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = detail::quad_sum(l[r]);
    const uint32_t row = 64 * wg + 16 * warp + g + 8 * r;
    if (row >= it.rows) continue;
    const float inv = sum > 0.f ? p.kv.v_scale / sum : 0.f;  // v_scale: 1 unless fp8
    const uint32_t tok = row / p.kv.group, head = row % p.kv.group;
    if (p.split.partial_o != nullptr &&
        store_partial_sm90(p.split, o, m[r], sum, inv, r, t, it.chunk, it.q0 + it.t0 + tok,
                           p.kv.q_heads, h * p.kv.group + head))
      continue;
    T* out =
        p.kv.o +
        (static_cast<int64_t>(it.q0 + it.t0 + tok) * p.kv.q_heads + h * p.kv.group + head) * kD;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<uint32_t*>(out + 8 * j + 2 * t) =
          detail::Elem<T>::pack(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
  }
}

// Registers per thread of the producer and the consumers (128 x producer + 256 x consumer <=
// 64K): an fp8 producer converts tiles and gets more.
template <typename KV>
constexpr int kProducerRegs = detail::kIsFp8<KV> ? 56 : 40;
template <typename KV>
constexpr int kConsumerRegs = detail::kIsFp8<KV> ? 224 : 232;

// Grid (work item, kv_head), 384 threads: warpgroup 0 produces, 1 and 2 consume. Rows as in
// PagedPrefillKernel (r = token * group + head, 128 a CTA); KV range [kv_begin, kv_end) in tiles
// of 128 tokens, masked only where a tile crosses some row's causal limit or window start.
template <typename T, typename KV, bool PAGED, bool PINGPONG>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillSm90Kernel(const __grid_constant__ Sm90Params<T, KV> p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = detail::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* sm = smem_raw + (base - raw);
  const int tid = threadIdx.x;
  const Item it = make_item(p);
  if (tid == 0) {
    mbar_init(base + kBarAt, 128);  // Q: the producer's threads
    for (uint32_t s = 0; s < kStages; ++s) {
      mbar_init(stage_bar(base, kKFull, s), 128);
      mbar_init(stage_bar(base, kVFull, s), 128);
      mbar_init(stage_bar(base, kKEmpty, s), 256);
      mbar_init(stage_bar(base, kVEmpty, s), 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid < 128) {
    setmaxnreg_dec<kProducerRegs<KV>>();
    const auto loc = detail::make_locator<PAGED, kD>(p.kv, it.seq, it.head);
    produce<T, KV>(p, it, loc, sm, base, tid);
  } else {
    setmaxnreg_inc<kConsumerRegs<KV>>();
    consume<T, KV, PINGPONG>(p, it, base, tid - 128);
  }
#else
  __trap();  // launched only on compute capability 9.0 (prefill_sm90_eligible)
#endif
}

template <typename T, typename KV, bool PAGED, bool PINGPONG>
cudaError_t launch_sm90(const AttentionShape& shape, const PrefillArgs& a, cudaStream_t stream) {
  constexpr auto kernel = PrefillSm90Kernel<T, KV, PAGED, PINGPONG>;
  constexpr size_t smem = kSmemBytes<detail::kIsFp8<KV>>;
  if (cudaError_t e = detail::allow_smem<kernel>(smem); e != cudaSuccess) return e;
  Sm90Params<T, KV> p{};
  p.kv = detail::make_kv_params<T, KV>(shape, a.q, a.o, a.cache, a.seqs, a.scale, a.kv_scales);
  p.qo_indptr = a.qo_indptr;
  p.work = a.work;
  p.tokens_per_tile = prefill_tokens_per_tile(shape);
  p.window = a.window > 0 && a.window < kNoWindow ? a.window : kNoWindow;
  p.work_words = 2;
  if (a.split.kv_chunk != 0) {  // split
    p.split = detail::prefill_split_view(shape, a);
    p.work_words = 3;
  }
  kernel<<<dim3(a.num_tiles, shape.kv_heads), kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool prefill_sm90_eligible(const AttentionShape& shape, bool /*split: both run here*/) {
  static const bool disabled = [] {
    const char* e = std::getenv("MEMSIM_PREFILL_SM90");
    return e != nullptr && e[0] == '0';
  }();
  if (disabled || shape.head_dim != kD) return false;
  if (prefill_rows(shape.head_dim) != kRows || !check_shape(shape).empty()) return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;  // sm_90a machine code runs on 9.0 only
}

cudaError_t paged_prefill_sm90(const AttentionShape& shape, const PrefillArgs& a,
                               cudaStream_t stream) {
  return detail::dispatch_kv(shape, a.cache.addressing,
                             [&]<typename T, typename KV, int D, bool PAGED>() {
                               if constexpr (D == kD) {
                                 // Pingpong on (without it: 373.6 TFLOP/s at 4K x 4K causal against
                                 // 378.3, one H100 call).
                                 return launch_sm90<T, KV, PAGED, true>(shape, a, stream);
                               } else {
                                 return cudaErrorInvalidValue;
                               }
                             });
}

}  // namespace memsim::kernels
