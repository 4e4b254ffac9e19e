// Device core of attention over an fp8 KV cache (e4m3 or e5m2, per-tensor scales): fp8 tiles
// copied by cp.async (paged decode's whole tiles at blocks of 64 tokens and up: by TMA) into
// byte-swizzled shared memory (half the bytes of a bf16 row, so a decode
// tile holds twice a bf16 tile's tokens), K and V fragments read with ldmatrix on the bytes and
// converted to the compute dtype in registers, the same mma.sync and online softmax as
// attention_core.cuh.
//
// Fragment layout. ldmatrix (non-transposed) over an 8 x 16-byte fp8 matrix gives a thread bytes
// 4t..4t+3 of row g (g = lane / 4, t = lane % 4): for QK^T that is head dims 4t..4t+3 of token g,
// so the k-step's slots {2t, 2t+1, 2t+8, 2t+9} hold dims {4t .. 4t+3}; Q's A fragments are read
// in that order from shared memory (a dot product does not depend on the order of its terms).
// For PV, ldmatrix.trans over the bytes gives a thread the byte pairs (dims 2g, 2g+1) of tokens
// 2t and 2t+1; a byte permute splits them into an even-dim and an odd-dim B fragment, so output
// n-tile d holds dims 16 (d / 2) + 2n + (d % 2) (o_col_fp8 below), which the kernels' output
// writes follow. FlashInfer reads fp8 KV into mma fragments the same way (ldmatrix over the bytes,
// then a register shuffle of the bytes); this is memsim's own layout.
//
// Scales: K's scale is folded into the softmax scale and V's into the output's 1 / l, so the
// conversion is exact (every e4m3 and e5m2 value is a bf16 and an fp16 value) and x * scale is
// applied in fp32.
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "kernels/attention_core.cuh"
#include "kernels/attention_sm90.cuh"

namespace memsim::kernels::detail {

template <typename KV>
inline constexpr bool kIsFp8 =
    std::is_same_v<KV, __nv_fp8_e4m3> || std::is_same_v<KV, __nv_fp8_e5m2>;

template <typename KV>
inline constexpr __nv_fp8_interpretation_t kFp8Kind =
    std::is_same_v<KV, __nv_fp8_e5m2> ? __NV_E5M2 : __NV_E4M3;

// Two fp8 values (low byte first) to two values of T packed as an mma operand register.
template <typename T, typename KV>
__device__ __forceinline__ uint32_t fp8x2_to(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), kFp8Kind<KV>);
  if constexpr (std::is_same_v<T, __half>) {
    return uint32_t{h.x} | (uint32_t{h.y} << 16);
  } else {
    const float2 f = __half22float2(__half2(h));
    return Elem<T>::pack(f.x, f.y);
  }
}

// A packed pair of T (low half first) as two floats.
template <typename T>
struct Elem2;
template <>
struct Elem2<__nv_bfloat16> {
  static __device__ __forceinline__ float2 to_float2(uint32_t two) {
    return make_float2(__uint_as_float(two << 16), __uint_as_float(two & 0xffff0000u));
  }
};
template <>
struct Elem2<__half> {
  static __device__ __forceinline__ float2 to_float2(uint32_t two) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = two;
    return __half22float2(h);
  }
};

// Output column (head dim) of accumulator element (n-tile d, thread t, column j of its pair).
__device__ __forceinline__ int o_col_fp8(int d, int t, int j) {
  return 16 * (d >> 1) + 4 * t + 2 * j + (d & 1);
}

// Geometry of an fp8 tile pipeline: as Tiles (attention_core.cuh) with fp8 K/V rows of D bytes
// (kChunks 16-byte chunks each, swizzled so the 8 rows of an ldmatrix hit distinct banks) and
// kStages stages; Q stays in the compute dtype with Tiles' layout (QTL).
template <typename T, int D, int WARPS_M, int WARPS_N, int BN, int MT, int STAGES,
          typename C = __half>
struct Fp8Tiles {
  using QTL = Tiles<T, D, WARPS_M, WARPS_N, BN, MT>;
  using Compute = C;  // the mma operands' type (Q is converted to it in shared memory)
  static constexpr int kThreads = QTL::kThreads;
  static constexpr int kWarpsM = WARPS_M;
  static constexpr int kWarpsN = WARPS_N;
  static constexpr int kBN = BN;
  static constexpr int kD = D;
  static constexpr int kMT = MT;
  static constexpr int kRows = QTL::kRows;
  static constexpr int kChunks = D / 16;  // 16-byte chunks per fp8 row
  static constexpr int kWarpTokens = BN / WARPS_N;
  static constexpr int kNT = kWarpTokens / 8;
  static constexpr int kKS = D / 16;
  static constexpr int kDT = D / 8;
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kLoadRows = BN / kRowsPerPass;
  static constexpr int kStages = STAGES;
  static constexpr int kTileBytes = BN * D;
  static constexpr size_t kQBytes = sizeof(T) * QTL::kQElems;
  static constexpr size_t kSmemBytes = kQBytes + size_t{2} * kStages * kTileBytes;
  static constexpr bool kPrefetchRows = WARPS_N > 1;
  static_assert(kWarpTokens % 16 == 0 && kKS % 2 == 0 && D % 32 == 0, "fp8 tile shape");
  static_assert(kThreads % kChunks == 0 && BN % kRowsPerPass == 0, "fp8 tile load shape");
  static_assert((STAGES & (STAGES - 1)) == 0 && STAGES >= 2, "stages: a power of two");

  static __device__ __forceinline__ int swz(int row, int chunk) {  // byte index
    const int x = kChunks >= 8 ? (row & 7) : ((row >> 1) & 3);
    return row * D + ((chunk ^ x) << 4);
  }
};

// Issues cp.async for the fetched fp8 K and V rows into one stage (rows past the range zeroed).
template <class TL, class Loc>
__device__ __forceinline__ void issue_rows_fp8(uint8_t* ks, uint8_t* vs, const uint8_t* k,
                                               const uint8_t* v, const Loc& loc,
                                               const RowFetch<TL>& f, int tid) {
  const int chunk = tid % TL::kChunks;
  const int r0 = tid / TL::kChunks;
#pragma unroll
  for (int i = 0; i < TL::kLoadRows; ++i) {
    const int r = r0 + i * TL::kRowsPerPass;
    const bool ok = (f.valid >> i) & 1u;
    const int64_t off = loc.offset(f.a[i], f.b[i]) + chunk * 16;
    cp_async_16(ks + TL::swz(r, chunk), k + off, ok);
    cp_async_16(vs + TL::swz(r, chunk), v + off, ok);
  }
}

// Q's A fragments of k-step kk in the fp8 K order (slots {2t, 2t+1, 2t+8, 2t+9} = dims 4t..4t+3).
template <class TL, typename T>
__device__ __forceinline__ void load_q_frag_fp8(uint32_t a[4], const T* qs, int row0, int kk,
                                                int lane) {
  using QTL = typename TL::QTL;
  const int g = lane >> 2, t = lane & 3;
  const int chunk = 2 * kk + (t >> 1), within = 4 * (t & 1);
  const uint2 lo = *reinterpret_cast<const uint2*>(qs + QTL::swz(row0 + g, chunk) + within);
  const uint2 hi = *reinterpret_cast<const uint2*>(qs + QTL::swz(row0 + g + 8, chunk) + within);
  a[0] = lo.x;
  a[1] = hi.x;
  a[2] = lo.y;
  a[3] = hi.y;
}

// Decode's one m-tile (head_dim <= 128): Q's A fragments are read from shared memory once, into
// 32 registers, instead of once a tile (16 8-byte reads a thread, 2-way bank conflicts). Measured
// on an H200: fp8 paged decode 1.03-1.06x faster, no spills (222 registers at 2 CTAs per SM).
template <class TL>
inline constexpr bool kQInRegs = TL::kMT == 1 && TL::kWarpsM == 1 && TL::kD <= 128;
template <class TL>
using QRegs = uint32_t[kQInRegs<TL> ? TL::kKS : 1][4];

// One fp8 KV tile for one warp: as attend_tile, with the fragments read and converted as the
// file comment says (Q's from `qf` when kQInRegs, else from shared memory at `qs`).
template <class TL, typename T, typename KV>
__device__ __forceinline__ void attend_tile_fp8(RowState<TL::kDT> (&st)[TL::kMT], const T* qs,
                                                const QRegs<TL>& qf, const uint8_t* ks,
                                                const uint8_t* vs, int wm, int wn, int lane,
                                                uint32_t tile_start,
                                                const uint32_t (&limit)[TL::kMT][2], bool masked,
                                                float scale_log2, uint32_t window) {
  using C = typename TL::Compute;
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
  // S = Q K^T, two k-steps (two 16-byte chunks of a K row) per ldmatrix_x4.
#pragma unroll
  for (int k2 = 0; k2 < TL::kKS / 2; ++k2) {
    uint32_t a[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (kQInRegs<TL>) {
#pragma unroll
          for (int x = 0; x < 4; ++x) a[mt][h][x] = qf[2 * k2 + h][x];
        } else {
          load_q_frag_fp8<TL>(a[mt][h], qs, (wm * MT + mt) * 16, 2 * k2 + h, lane);
        }
      }
#pragma unroll
    for (int p = 0; p < TL::kNT / 2; ++p) {
      uint32_t r[4];
      const int row = wtok + 16 * p + (mi & 1) * 8 + (lane & 7);
      ldmatrix_x4(r, ks + TL::swz(row, 2 * k2 + (mi >> 1)));
      uint32_t b[4][2];  // (n-tile 2p, 2p + 1) x (k-step 2 k2, 2 k2 + 1): r[0], r[1], r[2], r[3]
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        b[x][0] = fp8x2_to<C, KV>(r[x]);
        b[x][1] = fp8x2_to<C, KV>(r[x] >> 16);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Elem<C>::mma(s[mt][2 * p], a[mt][0], b[0][0], b[0][1]);
        Elem<C>::mma(s[mt][2 * p + 1], a[mt][0], b[1][0], b[1][1]);
        Elem<C>::mma(s[mt][2 * p], a[mt][1], b[2][0], b[2][1]);
        Elem<C>::mma(s[mt][2 * p + 1], a[mt][1], b[3][0], b[3][1]);
      }
    }
  }

  online_softmax<TL>(st, s, lane, wtok, tile_start, limit, masked, scale_log2, window);

  // O += P V: each ldmatrix_x4.trans covers 16 tokens x 32 dims (two chunks, four n-tiles).
#pragma unroll
  for (int p = 0; p < TL::kNT / 2; ++p) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) pack_p_frag<C>(a[mt], s[mt][2 * p], s[mt][2 * p + 1]);
    const int row = wtok + 16 * p + (mi & 1) * 8 + (lane & 7);
#pragma unroll
    for (int dp = 0; dp < TL::kD / 32; ++dp) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, vs + TL::swz(row, 2 * dp + (mi >> 1)));
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        // Bytes of r: (token 2t: dims 2g, 2g+1), (token 2t+1: dims 2g, 2g+1) -> low half: dim
        // 2g of both tokens, high half: dim 2g+1.
        const uint32_t r0 = r[2 * c], r1 = r[2 * c + 1];
        const uint32_t even0 = fp8x2_to<C, KV>(__byte_perm(r0, 0, 0x4420));
        const uint32_t even1 = fp8x2_to<C, KV>(__byte_perm(r1, 0, 0x4420));
        const uint32_t odd0 = fp8x2_to<C, KV>(__byte_perm(r0, 0, 0x4431));
        const uint32_t odd1 = fp8x2_to<C, KV>(__byte_perm(r1, 0, 0x4431));
        const int d = 4 * dp + 2 * c;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Elem<C>::mma(st[mt].o[d], a[mt], even0, even1);
          Elem<C>::mma(st[mt].o[d + 1], a[mt], odd0, odd1);
        }
      }
    }
  }
}

// Converts Q (T, in shared memory) in place to the compute type fp16, times 2^-e with e chosen
// so that the largest |q| of the tile lands in [2^14, 2^15): every bf16 value in range is then
// exact in fp16 (an fp16 has more mantissa bits; only values 2^24 below the largest, whose
// products vanish in the sum anyway, lose bits), and no value overflows. Returns 2^e, the factor
// the scores' scale takes back. Each thread converts the 16-byte chunks it read; the caller's next
// barrier orders the writes before the fragment reads.
template <class TL, typename T>
__device__ __forceinline__ float q_to_compute(unsigned char* smem, int tid) {
  static_assert(std::is_same_v<typename TL::Compute, __half> && sizeof(T) == 2, "Q to fp16");
  constexpr int kVecs = static_cast<int>(TL::kQBytes / 16);
  constexpr int kWarps = TL::kThreads / 32;
  __shared__ uint32_t red[kWarps];
  uint4* q = reinterpret_cast<uint4*>(smem);
  uint32_t amax = 0;  // largest |q| as the bits of a float (ordered as unsigned integers)
  for (int i = tid; i < kVecs; i += TL::kThreads) {
    const uint4 v = q[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = Elem2<T>::to_float2(w[j]);
      amax = max(amax, max(__float_as_uint(fabsf(f.x)), __float_as_uint(fabsf(f.y))));
    }
  }
  amax = __reduce_max_sync(0xffffffffu, amax);
  if ((tid & 31) == 0) red[tid >> 5] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) amax = max(amax, red[w]);
  // amax in [2^k, 2^(k+1)) with k = exponent - 127; e = k - 14, kept where 2^+-e is a normal float.
  const int e = min(max(static_cast<int>(amax >> 23) - 127 - 14, -100), 100);
  const float down = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
  for (int i = tid; i < kVecs; i += TL::kThreads) {
    const uint4 v = q[i];
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = Elem2<T>::to_float2(w[j]);
      w[j] = Elem<__half>::pack(f.x * down, f.y * down);
    }
    q[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  return __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
}

// Paged fp8 decode's whole KV tiles by TMA (Hopper). kv_tma_map's tensor maps view one layer's K
// or V as [blocks, block_size, kv_heads, head_dim] bytes and write 128-byte rows in the 128-byte
// swizzle, which is Fp8Tiles::swz at head_dim 128 when a stage starts on a 1024-byte boundary.
// One warp issues a tile's boxes, each `box_rows` (64) rows of one KV head in one block, on its
// stage's mbarrier, which counts the tile's bytes: the other warps issue no copies and compute no
// addresses. The boxes' block ids are loaded a tile ahead, one lane a box.
struct TmaKv {
  const CUtensorMap* k;
  const CUtensorMap* v;
  int box_rows;  // tokens a box (decode_tma_rows): divides the tile
  int head;      // the KV head (coordinate 1)
};

// This lane's box coordinates of the tile at tile_start (none for lanes past the tile's boxes).
template <class TL, class Loc>
__device__ __forceinline__ void tma_fetch(int& c2, int& c3, const Loc& loc, const TmaKv& tma,
                                          uint32_t tile_start, int lane) {
  if (lane * tma.box_rows < TL::kBN) loc.box(tile_start + lane * tma.box_rows, c2, c3);
}

// Warp-wide: one lane arms the stage's barrier with the tile's K and V bytes, each box's lane loads
// its K and V boxes.
template <class TL>
__device__ __forceinline__ void tma_issue(uint8_t* ks, uint8_t* vs, uint32_t bar, const TmaKv& tma,
                                          int c2, int c3, int lane) {
  if (lane == 0) sm90::mbar_arrive_expect_tx(bar, 2 * TL::kTileBytes);
  __syncwarp();
  if (lane * tma.box_rows < TL::kBN) {
    const uint32_t off = static_cast<uint32_t>(lane * tma.box_rows * TL::kD);
    sm90::tma_load_4d(smem_addr(ks) + off, tma.k, bar, 0, tma.head, c2, c3);
    sm90::tma_load_4d(smem_addr(vs) + off, tma.v, bar, 0, tma.head, c2, c3);
  }
}

// The kStages-deep pipeline over KV tokens [kv_begin, kv_end) (as attend_range, mask_below and
// window included; Q's cp.async group committed, nothing else pending). One barrier per tile: the
// stage a tile is issued into was last read in the previous iteration, which every warp has left at
// the barrier. TMA (`tma`, decode at head_dim 128, stages on 1024-byte boundaries): whole tiles
// come by TMA as above; a tile reaching past kv_end (the last, at most) by cp.async as without it.
template <class TL, typename T, typename KV, bool TMA = false, class Loc>
__device__ __forceinline__ void attend_range_fp8(
    RowState<TL::kDT> (&st)[TL::kMT], unsigned char* smem, const uint8_t* k, const uint8_t* v,
    const Loc& loc, uint32_t kv_begin, uint32_t kv_end, uint32_t mask_from,
    const uint32_t (&limit)[TL::kMT][2], float scale_log2, uint32_t mask_below = 0,
    uint32_t window = kNoWindow, const TmaKv* tma = nullptr) {
  constexpr int S = TL::kStages;
  static_assert(!TMA || (TL::kD == 128 && TL::kBN % 64 == 0), "TMA tiles: 128-byte rows");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / TL::kWarpsN, wn = warp % TL::kWarpsN;
  const T* qs = reinterpret_cast<const T*>(smem);
  uint8_t* kv = smem + TL::kQBytes;
  auto ks = [&](uint32_t stage) { return kv + (2 * stage) * TL::kTileBytes; };
  auto vs = [&](uint32_t stage) { return kv + (2 * stage + 1) * TL::kTileBytes; };
  auto start = [&](uint32_t i) { return kv_begin + i * TL::kBN; };

  const uint32_t ntiles = kv_end > kv_begin ? (kv_end - kv_begin + TL::kBN - 1) / TL::kBN : 0;
  RowFetch<TL> f;
  // TMA: one mbarrier a stage; warp 0's lanes hold the next whole tile's box coordinates.
  __shared__ uint64_t bars[TMA ? S : 1];
  auto bar = [&](uint32_t stage) { return smem_addr(&bars[stage]); };
  auto by_tma = [&](uint32_t i) { return TMA && start(i) + TL::kBN <= kv_end; };
  int c2 = 0, c3 = 0;
  if constexpr (TMA) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < S; ++s) sm90::mbar_init(bar(s), 1);
      sm90::fence_mbar_init();
    }
    __syncthreads();
    if (warp == 0 && by_tma(0)) tma_fetch<TL>(c2, c3, loc, *tma, start(0), lane);
  }
  // Tile i into its stage; TMA: then the next tile's coordinates.
  auto issue = [&](uint32_t i) {
    if constexpr (TMA) {
      if (by_tma(i)) {
        if (warp == 0) {
          tma_issue<TL>(ks(i % S), vs(i % S), bar(i % S), *tma, c2, c3, lane);
          if (by_tma(i + 1)) tma_fetch<TL>(c2, c3, loc, *tma, start(i + 1), lane);
        }
        return;
      }
    }
    if (TMA || !TL::kPrefetchRows || i < S - 1) fetch_rows<TL>(f, loc, start(i), kv_end, tid);
    issue_rows_fp8<TL>(ks(i % S), vs(i % S), k, v, loc, f, tid);
  };
#pragma unroll
  for (uint32_t i = 0; i + 1 < S; ++i) {
    if (i < ntiles) issue(i);
    cp_async_commit();
  }
  if (!TMA && TL::kPrefetchRows && S - 1 < ntiles)
    fetch_rows<TL>(f, loc, start(S - 1), kv_end, tid);
  if constexpr (!std::is_same_v<typename TL::Compute, T>) {
    cp_async_wait<S - 1>();  // Q has landed (the tiles may not have)
    __syncthreads();
    scale_log2 *= q_to_compute<TL, T>(smem, tid);  // the first tile's barrier orders the writes
  }
  QRegs<TL> qf;
  if constexpr (kQInRegs<TL>) {  // one m-tile: Q's fragments stay in registers
    cp_async_wait<S - 1>();      // Q has landed (the tiles may not have)
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TL::kKS; ++kk) load_q_frag_fp8<TL>(qf[kk], qs, 0, kk, lane);
  }
  for (uint32_t i = 0; i < ntiles; ++i) {
    cp_async_wait<S - 2>();  // Q and tiles 0..i have landed (cp.async)
    if (by_tma(i)) sm90::mbar_wait(bar(i % S), (i / S) & 1u);  // tile i has landed (TMA)
    __syncthreads();
    const uint32_t next = i + S - 1;
    if (next < ntiles) issue(next);
    cp_async_commit();
    if (!TMA && TL::kPrefetchRows && next + 1 < ntiles)
      fetch_rows<TL>(f, loc, start(next + 1), kv_end, tid);
    attend_tile_fp8<TL, T, KV>(st, qs, qf, ks(i % S), vs(i % S), wm, wn, lane, start(i), limit,
                               start(i) + TL::kBN > mask_from || start(i) < mask_below, scale_log2,
                               window);
  }
  cp_async_wait<0>();
  __syncthreads();
}

}  // namespace memsim::kernels::detail
