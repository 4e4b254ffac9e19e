// PagedPrefillKernel: causal attention of each sequence's new tokens over its cached prefix and
// themselves, ragged across the batch, tiles taken from a CPU-planned work list (split-KV: a
// chunk of a tile's KV range per item, merged by log-sum-exp after); host launcher.
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/attention.h"
#include "kernels/attention_core.cuh"
#include "kernels/attention_fp8.cuh"
#include "kernels/attention_merge.h"
#include "kernels/attention_prefill_sm90.h"
#include "kernels/attention_prefill_split.cuh"
#include "kernels/attention_tiles.h"
#include "kernels/dispatch.cuh"

namespace memsim::kernels {
namespace {

using detail::Tiles;

template <typename T, typename KV>
struct PrefillParams {
  detail::KvParams<T, KV> kv;
  const int32_t* qo_indptr;  // [batch + 1]
  const int32_t* work;       // {sequence, first token} per CTA row ({.., KV chunk} when split)
  uint32_t tokens_per_tile;
  detail::PrefillSplitView split;  // SPLIT kernels only
  uint32_t window;                 // sliding window, kNoWindow for full attention
};

template <typename T, int D>
using PrefillTiles =
    Tiles<T, D, 4, 1, static_cast<int>(prefill_kv_tile(D)), static_cast<int>(prefill_rows(D) / 64)>;
// fp8 caches: the same warps, rows and KV tile, two stages of fp8 K/V.
template <typename T, int D>
using PrefillFp8Tiles = detail::Fp8Tiles<T, D, 4, 1, static_cast<int>(prefill_kv_tile(D)),
                                         static_cast<int>(prefill_rows(D) / 64), 2>;
template <typename T, typename KV, int D>
using PrefillTilesOf =
    std::conditional_t<detail::kIsFp8<KV>, PrefillFp8Tiles<T, D>, PrefillTiles<T, D>>;

// Grid (work item, kv_head), 128 threads. Query rows are (token, head of the group) pairs, row
// r = token * group + head, so the group's heads share every K/V tile; each warp owns 16 x MT
// rows and walks the whole causal KV range [0, last token's position], or with a sliding window
// [first token's position + 1 - window, last token's position] (tiles before it are not read;
// those before the last token's window start are masked per row). WINDOW false: full attention
// with compile-time bounds (the code of a kernel without windows: no registers spent on them).
// SPLIT: the item's chunk of that range, written as partial rows unless a token's keys lie in
// that one chunk (with a window, chunks count from the first token's window start; a row whose
// window starts past the chunk writes an empty partial, which the merge weighs zero).
template <typename T, typename KV, int D, bool PAGED, bool SPLIT, bool WINDOW>
__global__ void __launch_bounds__(128)
    PagedPrefillKernel(const __grid_constant__ PrefillParams<T, KV> p) {
  using TL = PrefillTiles<T, D>;  // Q's layout, and K/V's unless fp8
  constexpr bool kFp8 = detail::kIsFp8<KV>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, wm = tid >> 5;
  const uint32_t h = blockIdx.y;
  constexpr int kWords = SPLIT ? 3 : 2;  // work words per item
  const int32_t seq = p.work[kWords * blockIdx.x];
  const uint32_t t0 = static_cast<uint32_t>(p.work[kWords * blockIdx.x + 1]);
  const uint32_t q0 = static_cast<uint32_t>(p.qo_indptr[seq]);
  const uint32_t q_len = static_cast<uint32_t>(p.qo_indptr[seq + 1]) - q0;
  const uint32_t kv_len = static_cast<uint32_t>(p.kv.kv_lens[seq]);
  const uint32_t prefix = kv_len - q_len;
  const uint32_t nt = min(p.tokens_per_tile, q_len - t0);
  const uint32_t rows = nt * p.kv.group;

  auto q_row = [&](int r) -> int64_t {
    if (r >= static_cast<int>(rows)) return -1;
    const uint32_t tok = r / p.kv.group, head = r % p.kv.group;
    return (static_cast<int64_t>(q0 + t0 + tok) * p.kv.q_heads + h * p.kv.group + head) * D;
  };
  detail::issue_q<TL>(smem, p.kv.q, q_row, tid);
  detail::cp_async_commit();

  const int g = lane >> 2, t = lane & 3;
  constexpr int MT = TL::kMT;
  auto row_of = [&](int mt, int r) {
    return static_cast<uint32_t>((wm * MT + mt) * 16 + g + 8 * r);
  };
  uint32_t limit[MT][2];
  detail::RowState<TL::kDT> st[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    st[mt].init();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t row = row_of(mt, r);
      limit[mt][r] = row < rows ? prefix + t0 + row / p.kv.group + 1 : 0;
    }
  }
  const uint32_t kv_end = prefix + t0 + nt;
  const uint32_t mask_from = prefix + t0 + 1;
  // Window: the first query's range starts at kv_begin, the last one's at mask_below.
  const uint32_t window = WINDOW ? p.window : detail::kNoWindow;
  const uint32_t kv_begin = WINDOW && mask_from > window ? mask_from - window : 0;
  const uint32_t mask_below = WINDOW && kv_end > window ? kv_end - window : 0;
  uint32_t kv_lo = kv_begin, kv_hi = kv_end, chunk = 0;
  if constexpr (SPLIT) {
    chunk = static_cast<uint32_t>(p.work[3 * blockIdx.x + 2]);
    p.split.chunk_range(chunk, kv_begin, kv_end, &kv_lo, &kv_hi);
  }
  const auto loc = detail::make_locator<PAGED, D>(p.kv, seq, h);
  if constexpr (kFp8) {
    detail::attend_range_fp8<PrefillFp8Tiles<T, D>, T, KV>(
        st, smem_raw, reinterpret_cast<const uint8_t*>(p.kv.k),
        reinterpret_cast<const uint8_t*>(p.kv.v), loc, kv_lo, kv_hi, mask_from, limit,
        p.kv.scale_log2, mask_below, window);
  } else {
    detail::attend_range<TL>(st, smem, p.kv.k, p.kv.v, loc, kv_lo, kv_hi, mask_from, limit,
                             p.kv.scale_log2, mask_below, window);
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = detail::quad_sum(st[mt].l[r]);
      const uint32_t row = row_of(mt, r);
      if (row >= rows) continue;
      float inv = l > 0.f ? 1.f / l : 0.f;
      const uint32_t tok = row / p.kv.group, head = row % p.kv.group;
      if constexpr (SPLIT)
        if (detail::store_partial<D, TL::kDT, kFp8>(p.split, st[mt], r, t, chunk, q0 + t0 + tok,
                                                    p.kv.q_heads, h * p.kv.group + head, l,
                                                    kFp8 ? inv * p.kv.v_scale : inv))
          continue;
      T* out =
          p.kv.o + (static_cast<int64_t>(q0 + t0 + tok) * p.kv.q_heads + h * p.kv.group + head) * D;
      if constexpr (kFp8) {
        // n-tiles 2c and 2c + 1 hold dims 16c + 4t + {0, 2} and {1, 3}: four adjacent dims.
        inv *= p.kv.v_scale;
#pragma unroll
        for (int c = 0; c < TL::kDT / 2; ++c) {
          const float* ev = st[mt].o[2 * c] + 2 * r;
          const float* od = st[mt].o[2 * c + 1] + 2 * r;
          uint2 w;
          w.x = detail::Elem<T>::pack(ev[0] * inv, od[0] * inv);
          w.y = detail::Elem<T>::pack(ev[1] * inv, od[1] * inv);
          *reinterpret_cast<uint2*>(out + 16 * c + 4 * t) = w;
        }
      } else {
#pragma unroll
        for (int d = 0; d < TL::kDT; ++d)
          *reinterpret_cast<uint32_t*>(out + 8 * d + 2 * t) =
              detail::Elem<T>::pack(st[mt].o[d][2 * r] * inv, st[mt].o[d][2 * r + 1] * inv);
      }
    }
}

template <typename T, typename KV, int D, bool PAGED, bool SPLIT, bool WINDOW>
cudaError_t launch_prefill(const AttentionShape& shape, const PrefillArgs& a, cudaStream_t stream) {
  using TL = PrefillTilesOf<T, KV, D>;
  constexpr auto kernel = PagedPrefillKernel<T, KV, D, PAGED, SPLIT, WINDOW>;
  if (cudaError_t e = detail::allow_smem<kernel>(TL::kSmemBytes); e != cudaSuccess) return e;
  PrefillParams<T, KV> p{};
  p.kv = detail::make_kv_params<T, KV>(shape, a.q, a.o, a.cache, a.seqs, a.scale, a.kv_scales);
  p.qo_indptr = a.qo_indptr;
  p.work = a.work;
  p.tokens_per_tile = prefill_tokens_per_tile(shape);  // prefill_rows(D) / group
  if constexpr (SPLIT) p.split = detail::prefill_split_view(shape, a);
  p.window = WINDOW ? a.window : detail::kNoWindow;
  kernel<<<dim3(a.num_tiles, shape.kv_heads), TL::kThreads, TL::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

// Split-KV prefill: the chunks' kernel (the Hopper one where it runs), then the per-token merge
// (the decode combine's math).
cudaError_t split_prefill(const AttentionShape& shape, const PrefillArgs& a, cudaStream_t stream) {
  if (a.workspace == 0 || a.split.kv_chunk % prefill_kv_tile(shape.head_dim) != 0 ||
      a.split.max_chunks < 2 || a.split.total_q == 0 || a.split.total_q > 65535)
    return cudaErrorInvalidValue;
  const bool window = a.window > 0 && a.window < detail::kNoWindow;
  const cudaError_t e =
      prefill_sm90_eligible(shape, true)
          ? paged_prefill_sm90(shape, a, stream)
          : detail::dispatch_kv(
                shape, a.cache.addressing, [&]<typename T, typename KV, int D, bool P>() {
                  return window ? launch_prefill<T, KV, D, P, true, true>(shape, a, stream)
                                : launch_prefill<T, KV, D, P, true, false>(shape, a, stream);
                });
  if (e != cudaSuccess) return e;
  const detail::PrefillSplitView v = detail::prefill_split_view(shape, a);
  return detail::merge_states(
      shape, {v.partial_o, v.partial_lse, a.o, v.merge_indptr, a.split.total_q, a.split.max_chunks},
      stream);
}

}  // namespace

cudaError_t paged_prefill(const AttentionShape& shape, const PrefillArgs& args,
                          cudaStream_t stream) {
  if (args.num_tiles == 0) return cudaSuccess;
  if (args.work == nullptr || args.qo_indptr == nullptr || args.seqs.kv_lens == nullptr)
    return cudaErrorInvalidValue;
  if (!detail::tables_match(args.cache, args.seqs) || !detail::fp8_cache_aligned(shape, args.cache))
    return cudaErrorInvalidValue;
  // A window the positions cannot reach is full attention.
  const bool window = args.window > 0 && args.window < detail::kNoWindow;
  if (args.split.kv_chunk) return split_prefill(shape, args, stream);
  if (prefill_sm90_eligible(shape, false)) return paged_prefill_sm90(shape, args, stream);
  return detail::dispatch_kv(
      shape, args.cache.addressing, [&]<typename T, typename KV, int D, bool PAGED>() {
        return window ? launch_prefill<T, KV, D, PAGED, false, true>(shape, args, stream)
                      : launch_prefill<T, KV, D, PAGED, false, false>(shape, args, stream);
      });
}

cudaError_t layer_attention(const AttentionShape& shape, const LayerAttentionArgs& a,
                            cudaStream_t stream) {
  if (a.decode) {
    DecodeArgs d;
    d.q = a.q;
    d.o = a.o;
    d.cache = a.cache;
    d.seqs = a.seqs;
    d.workspace = a.workspace;
    d.work = a.work;
    d.scale = a.scale;
    d.kv_scales = a.kv_scales;
    d.window = a.window;
    return paged_decode(shape, a.dplan, d, stream);
  }
  PrefillArgs p;
  p.q = a.q;
  p.o = a.o;
  p.qo_indptr = a.qo_indptr;
  p.cache = a.cache;
  p.seqs = a.seqs;
  p.work = a.work;
  p.num_tiles = a.num_tiles;
  p.scale = a.scale;
  p.kv_scales = a.kv_scales;
  p.split = a.psplit;
  p.workspace = a.workspace;
  p.window = a.window;
  return paged_prefill(shape, p, stream);
}

}  // namespace memsim::kernels
