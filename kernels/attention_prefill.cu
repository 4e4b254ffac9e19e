// PagedPrefillKernel: causal attention of each sequence's new tokens over its cached prefix and
// themselves, ragged across the batch, tiles taken from a CPU-planned work list; host launcher.
#include <cuda_runtime.h>

#include "kernels/attention.h"
#include "kernels/attention_core.cuh"
#include "kernels/attention_tiles.h"
#include "kernels/dispatch.cuh"

namespace memsim::kernels {
namespace {

using detail::Tiles;

template <typename T>
struct PrefillParams {
  const T* q;
  T* o;
  const T* k;
  const T* v;
  const int32_t* qo_indptr;
  const int32_t* kv_lens;
  const int32_t* block_tables;
  const int32_t* slots;
  const int32_t* work;
  uint32_t bt_stride;
  FastDiv block_size;
  int64_t block_stride;
  int64_t row;
  uint32_t q_heads, group, tokens_per_tile;
  float scale_log2;
};

template <typename T, int D>
using PrefillTiles =
    Tiles<T, D, 4, 1, static_cast<int>(prefill_kv_tile(D)), static_cast<int>(prefill_rows(D) / 64)>;

// Grid (work item, kv_head), 128 threads. Query rows are (token, head of the group) pairs, row
// r = token * group + head, so the group's heads share every K/V tile; each warp owns 16 x MT
// rows and walks the whole causal KV range [0, last token's position].
template <typename T, int D, bool PAGED>
__global__ void __launch_bounds__(128)
    PagedPrefillKernel(const __grid_constant__ PrefillParams<T> p) {
  using TL = PrefillTiles<T, D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, wm = tid >> 5;
  const uint32_t h = blockIdx.y;
  const int32_t seq = p.work[2 * blockIdx.x];
  const uint32_t t0 = static_cast<uint32_t>(p.work[2 * blockIdx.x + 1]);
  const uint32_t q0 = static_cast<uint32_t>(p.qo_indptr[seq]);
  const uint32_t q_len = static_cast<uint32_t>(p.qo_indptr[seq + 1]) - q0;
  const uint32_t kv_len = static_cast<uint32_t>(p.kv_lens[seq]);
  const uint32_t prefix = kv_len - q_len;
  const uint32_t nt = min(p.tokens_per_tile, q_len - t0);
  const uint32_t rows = nt * p.group;

  auto q_row = [&](int r) -> int64_t {
    if (r >= static_cast<int>(rows)) return -1;
    const uint32_t tok = r / p.group, head = r % p.group;
    return (static_cast<int64_t>(q0 + t0 + tok) * p.q_heads + h * p.group + head) * D;
  };
  detail::issue_q<TL>(smem, p.q, q_row, tid);
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
      limit[mt][r] = row < rows ? prefix + t0 + row / p.group + 1 : 0;
    }
  }
  const uint32_t kv_end = prefix + t0 + nt;
  const uint32_t mask_from = prefix + t0 + 1;
  if constexpr (PAGED) {
    const detail::PagedLocator loc{p.block_tables + static_cast<int64_t>(seq) * p.bt_stride,
                                   p.block_size, p.block_stride, p.row,
                                   static_cast<int64_t>(h) * D};
    detail::attend_range<TL>(st, smem, p.k, p.v, loc, 0, kv_end, mask_from, limit, p.scale_log2);
  } else {
    const detail::ContiguousLocator loc{
        static_cast<int64_t>(p.slots[seq]) * p.block_stride + static_cast<int64_t>(h) * D, p.row};
    detail::attend_range<TL>(st, smem, p.k, p.v, loc, 0, kv_end, mask_from, limit, p.scale_log2);
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = detail::quad_sum(st[mt].l[r]);
      const uint32_t row = row_of(mt, r);
      if (row >= rows) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const uint32_t tok = row / p.group, head = row % p.group;
      T* out = p.o + (static_cast<int64_t>(q0 + t0 + tok) * p.q_heads + h * p.group + head) * D;
#pragma unroll
      for (int d = 0; d < TL::kDT; ++d)
        *reinterpret_cast<uint32_t*>(out + 8 * d + 2 * t) =
            detail::Elem<T>::pack(st[mt].o[d][2 * r] * inv, st[mt].o[d][2 * r + 1] * inv);
    }
}

template <typename T, int D, bool PAGED>
cudaError_t launch_prefill(const AttentionShape& shape, const PrefillArgs& a, cudaStream_t stream) {
  using TL = PrefillTiles<T, D>;
  constexpr auto kernel = PagedPrefillKernel<T, D, PAGED>;
  if (cudaError_t e = detail::allow_smem<kernel>(TL::kSmemBytes); e != cudaSuccess) return e;
  PrefillParams<T> p{};
  p.q = reinterpret_cast<const T*>(a.q);
  p.o = reinterpret_cast<T*>(a.o);
  p.k = reinterpret_cast<const T*>(a.cache.k);
  p.v = reinterpret_cast<const T*>(a.cache.v);
  p.qo_indptr = a.qo_indptr;
  p.kv_lens = a.seqs.kv_lens;
  p.block_tables = a.seqs.block_tables;
  p.slots = a.seqs.slots;
  p.work = a.work;
  p.bt_stride = a.seqs.bt_stride;
  p.block_size = FastDiv(PAGED ? a.cache.block_size : 1);
  p.block_stride = a.cache.block_stride;
  p.row = static_cast<int64_t>(shape.row_elems());
  p.q_heads = shape.q_heads;
  p.group = shape.group();
  p.tokens_per_tile = prefill_tokens_per_tile(shape);  // prefill_rows(D) / group
  const float scale = a.scale > 0 ? a.scale : 1.f / sqrtf(static_cast<float>(D));
  p.scale_log2 = scale * 1.4426950408889634f;
  kernel<<<dim3(a.num_tiles, shape.kv_heads), TL::kThreads, TL::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t paged_prefill(const AttentionShape& shape, const PrefillArgs& args,
                          cudaStream_t stream) {
  if (args.num_tiles == 0) return cudaSuccess;
  if (args.work == nullptr || args.qo_indptr == nullptr || args.seqs.kv_lens == nullptr)
    return cudaErrorInvalidValue;
  if (args.cache.addressing == KvAddressing::kPaged &&
      (args.cache.block_size == 0 || args.seqs.block_tables == nullptr))
    return cudaErrorInvalidValue;
  if (args.cache.addressing == KvAddressing::kContiguous && args.seqs.slots == nullptr)
    return cudaErrorInvalidValue;
  return detail::dispatch(shape, args.cache.addressing, [&]<typename T, int D, bool PAGED>() {
    return launch_prefill<T, D, PAGED>(shape, args, stream);
  });
}

}  // namespace memsim::kernels
