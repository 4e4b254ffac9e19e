// Device core of the attention kernels: KV locators (paged block table or contiguous slot),
// cp.async tile loads into swizzled shared memory, mma.sync m16n8k16 for S = QK^T and O += PV,
// and the online softmax. Decode and prefill kernels instantiate it with different warp layouts;
// paged and contiguous caches differ only in the locator, so they do identical arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention_types.h"
#include "kernels/fastdiv.h"

namespace memsim::kernels::detail {

// ---- element types -----------------------------------------------------------------------------

template <typename T>
struct Elem;

template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Elem<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- memory primitives -------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; when !valid nothing is read and the destination is zeroed
// (padding rows must be zeros, not garbage: 0 x NaN would poison P x V).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

// ---- KV locators ---------------------------------------------------------------------------
// fetch(pos) returns what the row address needs (a paged block id is loaded here), offset() turns
// it into the element offset of the token's row (head offset included). The loader fetches a
// tile ahead, so the block-table load latency hides behind the current tile.

struct PagedLocator {
  const int32_t* table;  // this sequence's block table
  FastDiv block_size;
  uint32_t block_stride, row, head_off;  // elements (block_stride < 2^32: tables_match)
  // a = the block id of token pos (loaded), b = its row's element offset within the block.
  __device__ __forceinline__ void fetch(uint32_t pos, uint32_t& a, uint32_t& b) const {
    uint32_t blk, in;
    block_size.divmod(pos, blk, in);
    a = static_cast<uint32_t>(__ldg(table + blk));
    b = in * row + head_off;
  }
  __device__ __forceinline__ int64_t offset(uint32_t a, uint32_t b) const {
    return static_cast<int64_t>(static_cast<uint64_t>(a) * block_stride + b);
  }
  // A TMA box's coordinates of token pos (kv_tma_map's tensor): c2 = the token's row in its
  // block, c3 = the block id (loaded).
  __device__ __forceinline__ void box(uint32_t pos, int& c2, int& c3) const {
    uint32_t blk, in;
    block_size.divmod(pos, blk, in);
    c3 = __ldg(table + blk);
    c2 = static_cast<int>(in);
  }
};

struct ContiguousLocator {
  int64_t base, row;  // base = slot * seq_stride + head offset
  __device__ __forceinline__ void fetch(uint32_t pos, uint32_t& a, uint32_t& b) const {
    a = pos;
    b = 0;
  }
  __device__ __forceinline__ int64_t offset(uint32_t a, uint32_t) const {
    return base + static_cast<int64_t>(a) * row;
  }
};

// ---- parameters shared by the attention kernels -------------------------------------------------

// Q, O and one layer's K/V cache with the per-sequence tables (FlashInfer-style: the kernels'
// Params structs embed it and are passed as __grid_constant__).
template <typename T, typename KV = T>
struct KvParams {
  const T* q;
  T* o;
  const KV* k;  // the cache's storage type (T, or an fp8 type)
  const KV* v;
  const int32_t* kv_lens;
  const int32_t* block_tables;
  const int32_t* slots;
  uint32_t bt_stride;
  FastDiv block_size;    // paged only
  int64_t block_stride;  // paged: elements between blocks; contiguous: between slots
  int64_t row;           // kv_heads x head_dim
  uint32_t q_heads, group;
  float scale_log2;  // softmax scale x log2(e) (x k_scale for fp8 caches)
  float v_scale;     // fp8 caches: applied to the output with 1 / l (1 otherwise)
};

template <typename T, typename KV = T>
KvParams<T, KV> make_kv_params(const AttentionShape& shape, uint64_t q, uint64_t o,
                               const KvLayerView& cache, const SeqTables& seqs, float scale,
                               KvScales kv_scales = {}) {
  KvParams<T, KV> p{};
  p.q = reinterpret_cast<const T*>(q);
  p.o = reinterpret_cast<T*>(o);
  p.k = reinterpret_cast<const KV*>(cache.k);
  p.v = reinterpret_cast<const KV*>(cache.v);
  p.kv_lens = seqs.kv_lens;
  p.block_tables = seqs.block_tables;
  p.slots = seqs.slots;
  p.bt_stride = seqs.bt_stride;
  p.block_size = FastDiv(cache.addressing == KvAddressing::kPaged ? cache.block_size : 1);
  p.block_stride = cache.block_stride;
  p.row = static_cast<int64_t>(shape.row_elems());
  p.q_heads = shape.q_heads;
  p.group = shape.group();
  const float s = scale > 0 ? scale : 1.f / sqrtf(static_cast<float>(shape.head_dim));
  p.scale_log2 = s * 1.4426950408889634f;
  p.v_scale = 1.f;
  if constexpr (!std::is_same_v<T, KV>) {
    p.scale_log2 *= kv_scales.k;
    p.v_scale = kv_scales.v;
  }
  return p;
}

// The locator of sequence `seq`, KV head `h` (head_dim D).
template <bool PAGED, int D, typename T, typename KV>
__device__ __forceinline__ auto make_locator(const KvParams<T, KV>& p, uint32_t seq, uint32_t h) {
  const int64_t head_off = static_cast<int64_t>(h) * D;
  if constexpr (PAGED) {
    return PagedLocator{p.block_tables + static_cast<int64_t>(seq) * p.bt_stride, p.block_size,
                        static_cast<uint32_t>(p.block_stride), static_cast<uint32_t>(p.row),
                        static_cast<uint32_t>(head_off)};
  } else {
    return ContiguousLocator{static_cast<int64_t>(p.slots[seq]) * p.block_stride + head_off, p.row};
  }
}

// ---- tile geometry -----------------------------------------------------------------------------

// WARPS_M warps stacked over query rows (16 x MT each: MT m-tiles share every K/V fragment a warp
// loads from shared memory), WARPS_N warps side by side over each KV tile of BN tokens. Shared
// memory: Q [16 MT WARPS_M][D], then kStages x (K [BN][D], V [BN][D]), every row swizzled in
// 16-byte chunks (chunk ^ (row % 8)) so ldmatrix reads are conflict-free.
template <typename T, int D, int WARPS_M, int WARPS_N, int BN, int MT = 1>
struct Tiles {
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int kWarpsM = WARPS_M;
  static constexpr int kWarpsN = WARPS_N;
  static constexpr int kBN = BN;
  static constexpr int kD = D;
  static constexpr int kMT = MT;
  static constexpr int kRows = 16 * MT * WARPS_M;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kWarpTokens = BN / WARPS_N;
  static constexpr int kNT = kWarpTokens / 8;  // S n-tiles per warp
  static constexpr int kKS = D / 16;           // k-steps over the head dimension
  static constexpr int kDT = D / 8;            // O n-tiles
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kLoadRows = BN / kRowsPerPass;  // KV rows each thread loads per tile
  static constexpr int kStages = 2;
  static constexpr int kQElems = kRows * D;
  static constexpr int kTileElems = BN * D;
  static constexpr size_t kSmemBytes = sizeof(T) * (kQElems + 2 * kStages * kTileElems);
  // Q fragments stay in registers for compute-bound prefill tiles when they fit; memory-bound
  // decode (WARPS_N > 1) reloads them from shared memory and spends the registers on occupancy.
  static constexpr bool kQInRegs = D <= 128 && MT == 1 && WARPS_N == 1;
  // Memory-bound decode fetches KV row addresses (block-table loads) a tile ahead; compute-bound
  // prefill fetches them just before the copy and keeps the registers for its tiles.
  static constexpr bool kPrefetchRows = WARPS_N > 1;
  static_assert(kWarpTokens % 16 == 0, "a warp needs 16 tokens per P x V k-step");
  static_assert(kThreads % kChunks == 0 && BN % kRowsPerPass == 0, "tile load shape");
  static_assert(kChunks >= 8, "swizzle needs 8 chunks per row");

  static __device__ __forceinline__ int swz(int row, int chunk) {  // element index
    return row * D + ((chunk ^ (row & 7)) << 3);
  }
};

// Per-thread softmax state for its two rows (g and g + 8 of its warp's 16) and their outputs.
template <int DT>
struct RowState {
  float m[2], l[2];
  float o[DT][4];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.f;
    }
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[d][e] = 0.f;
  }
};

// The KV rows one thread loads for a tile, fetched ahead (see the locators).
template <class TL>
struct RowFetch {
  uint32_t a[TL::kLoadRows], b[TL::kLoadRows];
  uint32_t valid;  // bit i: row i is below load_end
};

template <class TL, class Loc>
__device__ __forceinline__ void fetch_rows(RowFetch<TL>& f, const Loc& loc, uint32_t tile_start,
                                           uint32_t load_end, int tid) {
  const uint32_t pos0 = tile_start + tid / TL::kChunks;
  if (tile_start + TL::kBN <= load_end) {  // a whole tile (warp-uniform): no row predicates
#pragma unroll
    for (int i = 0; i < TL::kLoadRows; ++i) loc.fetch(pos0 + i * TL::kRowsPerPass, f.a[i], f.b[i]);
    f.valid = (1u << TL::kLoadRows) - 1;
    return;
  }
  f.valid = 0;
#pragma unroll
  for (int i = 0; i < TL::kLoadRows; ++i) {
    const uint32_t pos = pos0 + i * TL::kRowsPerPass;
    f.a[i] = f.b[i] = 0;  // a row past the end copies nothing from offset(0, 0), a valid address
    if (pos < load_end) {
      loc.fetch(pos, f.a[i], f.b[i]);
      f.valid |= 1u << i;
    }
  }
}

// Issues cp.async for the fetched K and V rows into one stage; rows at or past load_end are
// zero-filled without being read.
template <class TL, typename T, class Loc>
__device__ __forceinline__ void issue_rows(T* ks, T* vs, const T* k, const T* v, const Loc& loc,
                                           const RowFetch<TL>& f, int tid) {
  const int chunk = tid % TL::kChunks;
  const int r0 = tid / TL::kChunks;
#pragma unroll
  for (int i = 0; i < TL::kLoadRows; ++i) {
    const int r = r0 + i * TL::kRowsPerPass;
    const bool ok = (f.valid >> i) & 1u;
    const int64_t off = loc.offset(f.a[i], f.b[i]) + chunk * 8;
    cp_async_16(ks + TL::swz(r, chunk), k + off, ok);
    cp_async_16(vs + TL::swz(r, chunk), v + off, ok);
  }
}

// Copies query rows into shared memory: row r comes from q_row(r) (element offset), or is zeroed
// when q_row(r) < 0.
template <class TL, typename T, class RowFn>
__device__ __forceinline__ void issue_q(T* qs, const T* q, const RowFn& q_row, int tid) {
  for (int i = tid; i < TL::kRows * TL::kChunks; i += TL::kThreads) {
    const int r = i / TL::kChunks, chunk = i % TL::kChunks;
    const int64_t off = q_row(r);
    cp_async_16(qs + TL::swz(r, chunk), q + (off >= 0 ? off + chunk * 8 : 0), off >= 0);
  }
}

// A fragments of Q for k-step kk of the m-tile starting at row `row0`.
template <class TL, typename T>
__device__ __forceinline__ void load_q_frag(uint32_t a[4], const T* qs, int row0, int kk,
                                            int lane) {
  const int mi = lane >> 3;
  const int row = row0 + (mi & 1) * 8 + (lane & 7);
  ldmatrix_x4(a, qs + TL::swz(row, 2 * kk + (mi >> 1)));
}

// A sliding window no sequence reaches (positions are below 2^31): full attention in the masks.
inline constexpr uint32_t kNoWindow = 1u << 31;

// Scale, mask, row max and the online softmax update of one tile's scores (rows g: e = 0, 1;
// g + 8: e = 2, 3); leaves P in `s`. Score column j, element e is KV token tile_start + wtok +
// 8 j + 2 t + (e & 1). A row of limit L sees tokens L - window <= tok < L (window kNoWindow:
// every token below L).
template <class TL>
__device__ __forceinline__ void online_softmax(RowState<TL::kDT> (&st)[TL::kMT],
                                               float (&s)[TL::kMT][TL::kNT][4], int lane, int wtok,
                                               uint32_t tile_start,
                                               const uint32_t (&limit)[TL::kMT][2], bool masked,
                                               float scale_log2, uint32_t window) {
  constexpr int MT = TL::kMT;
  const int t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < TL::kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[mt][j][e] * scale_log2;
        if (masked) {
          const uint32_t tok = tile_start + wtok + 8 * j + 2 * t + (e & 1);
          const uint32_t lim = limit[mt][e >> 1];
          if (tok >= lim || (window != kNoWindow && tok + window < lim)) v = -INFINITY;
        }
        s[mt][j][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(st[mt].m[r], mx[r]);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: keep zeros
      alpha[r] = exp2f(st[mt].m[r] - m_use);
      st[mt].m[r] = m_new;
      st[mt].l[r] *= alpha[r];
      mx[r] = m_use;
    }
    // Rescale O only when some row's max moved (rare after the first tiles): the multiplies
    // cost as much as the P x V MMAs of a short tile.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int d = 0; d < TL::kDT; ++d) {
        st[mt].o[d][0] *= alpha[0];
        st[mt].o[d][1] *= alpha[0];
        st[mt].o[d][2] *= alpha[1];
        st[mt].o[d][3] *= alpha[1];
      }
    }
#pragma unroll
    for (int j = 0; j < TL::kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[mt][j][e] - mx[e >> 1]);
        s[mt][j][e] = p;
        st[mt].l[e >> 1] += p;
      }
  }
}

// P's A fragment of one 16-token k-step (score n-tiles 2p and 2p + 1 of a row pair), rounded to
// T: the accumulator layout of S is the A layout of P x V.
template <typename T>
__device__ __forceinline__ void pack_p_frag(uint32_t a[4], const float (&s0)[4],
                                            const float (&s1)[4]) {
  a[0] = Elem<T>::pack(s0[0], s0[1]);
  a[1] = Elem<T>::pack(s0[2], s0[3]);
  a[2] = Elem<T>::pack(s1[0], s1[1]);
  a[3] = Elem<T>::pack(s1[2], s1[3]);
}

// One KV tile for one warp: S = Q K^T over its kWarpTokens tokens for each of its MT m-tiles,
// mask, online softmax update, O += P V. `limit[mt][r]` is the first KV position that row r of
// m-tile mt may not see (and limit - window the first it sees); `masked` says whether any token
// of the tile can fall outside a row's range (skips the compare otherwise).
template <class TL, typename T>
__device__ __forceinline__ void attend_tile(RowState<TL::kDT> (&st)[TL::kMT],
                                            const uint32_t (&qf)[TL::kQInRegs ? TL::kKS : 1][4],
                                            const T* qs, const T* ks, const T* vs, int wm, int wn,
                                            int lane, uint32_t tile_start,
                                            const uint32_t (&limit)[TL::kMT][2], bool masked,
                                            float scale_log2, uint32_t window) {
  constexpr int MT = TL::kMT;
  float s[MT][TL::kNT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < TL::kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.f;

  const int mi = lane >> 3;
  const int wtok = wn * TL::kWarpTokens;
#pragma unroll
  for (int kk = 0; kk < TL::kKS; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (TL::kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[mt][e] = qf[kk][e];
      } else {
        load_q_frag<TL>(a[mt], qs, (wm * MT + mt) * 16, kk, lane);
      }
    }
#pragma unroll
    for (int p = 0; p < TL::kNT / 2; ++p) {
      uint32_t b[4];
      const int row = wtok + 16 * p + (mi >> 1) * 8 + (lane & 7);
      ldmatrix_x4(b, ks + TL::swz(row, 2 * kk + (mi & 1)));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Elem<T>::mma(s[mt][2 * p], a[mt], b[0], b[1]);
        Elem<T>::mma(s[mt][2 * p + 1], a[mt], b[2], b[3]);
      }
    }
  }

  online_softmax<TL>(st, s, lane, wtok, tile_start, limit, masked, scale_log2, window);

  // O += P V, 16 tokens per k-step; each V fragment serves every m-tile.
#pragma unroll
  for (int p = 0; p < TL::kNT / 2; ++p) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) pack_p_frag<T>(a[mt], s[mt][2 * p], s[mt][2 * p + 1]);
    const int row = wtok + 16 * p + (mi & 1) * 8 + (lane & 7);
#pragma unroll
    for (int dp = 0; dp < TL::kDT / 2; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vs + TL::swz(row, 2 * dp + (mi >> 1)));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Elem<T>::mma(st[mt].o[2 * dp], a[mt], b[0], b[1]);
        Elem<T>::mma(st[mt].o[2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Runs the two-stage pipeline over KV tokens [kv_begin, kv_end) for every warp of the CTA; Q's
// cp.async group must be committed (and nothing else pending). `mask_from`: tiles ending at or
// before it cannot reach any row's limit and skip the mask; with a sliding `window`, tiles
// starting before `mask_below` (the highest first-visible position of any row) are masked too.
// Leaves shared memory free (synced).
template <class TL, typename T, class Loc>
__device__ __forceinline__ void attend_range(RowState<TL::kDT> (&st)[TL::kMT], T* smem, const T* k,
                                             const T* v, const Loc& loc, uint32_t kv_begin,
                                             uint32_t kv_end, uint32_t mask_from,
                                             const uint32_t (&limit)[TL::kMT][2], float scale_log2,
                                             uint32_t mask_below = 0, uint32_t window = kNoWindow) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / TL::kWarpsN, wn = warp % TL::kWarpsN;
  T* qs = smem;
  T* kv = smem + TL::kQElems;
  auto ks = [&](int stage) { return kv + (2 * stage) * TL::kTileElems; };
  auto vs = [&](int stage) { return kv + (2 * stage + 1) * TL::kTileElems; };

  const uint32_t ntiles = kv_end > kv_begin ? (kv_end - kv_begin + TL::kBN - 1) / TL::kBN : 0;
  RowFetch<TL> f;
  if (ntiles > 0) {
    fetch_rows<TL>(f, loc, kv_begin, kv_end, tid);
    issue_rows<TL>(ks(0), vs(0), k, v, loc, f, tid);
  }
  cp_async_commit();
  if (TL::kPrefetchRows && ntiles > 1) fetch_rows<TL>(f, loc, kv_begin + TL::kBN, kv_end, tid);
  cp_async_wait<1>();  // Q has landed (tile 0 may still be in flight)
  __syncthreads();
  uint32_t qf[TL::kQInRegs ? TL::kKS : 1][4];
  if constexpr (TL::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < TL::kKS; ++kk) load_q_frag<TL>(qf[kk], qs, wm * 16, kk, lane);
  }
  for (uint32_t i = 0; i < ntiles; ++i) {
    const uint32_t start = kv_begin + i * TL::kBN;
    if (i + 1 < ntiles) {
      if constexpr (!TL::kPrefetchRows) fetch_rows<TL>(f, loc, start + TL::kBN, kv_end, tid);
      issue_rows<TL>(ks((i + 1) & 1), vs((i + 1) & 1), k, v, loc, f, tid);
    }
    cp_async_commit();
    // The table loads of tile i + 2 fly while tile i is waited for and computed.
    if (TL::kPrefetchRows && i + 2 < ntiles)
      fetch_rows<TL>(f, loc, start + 2 * TL::kBN, kv_end, tid);
    cp_async_wait<1>();
    __syncthreads();
    attend_tile<TL>(st, qf, qs, ks(i & 1), vs(i & 1), wm, wn, lane, start, limit,
                    start + TL::kBN > mask_from || start < mask_below, scale_log2, window);
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();
}

// Sums the row's l over the four threads of its quad (each accumulated its own columns).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

}  // namespace memsim::kernels::detail
