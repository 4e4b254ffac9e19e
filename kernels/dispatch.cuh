// The one dispatch point of the attention kernels: run-time (dtype, head_dim, addressing) to
// template arguments. A launcher passes a generic lambda `[&]<typename T, int D, bool PAGED>()`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/attention.h"

namespace memsim::kernels::detail {

template <typename T, int D, class F>
cudaError_t dispatch_addressing(KvAddressing a, F&& f) {
  return a == KvAddressing::kPaged ? f.template operator()<T, D, true>()
                                   : f.template operator()<T, D, false>();
}

template <typename T, class F>
cudaError_t dispatch_head_dim(uint32_t head_dim, KvAddressing a, F&& f) {
  switch (head_dim) {
    case 64:
      return dispatch_addressing<T, 64>(a, f);
    case 128:
      return dispatch_addressing<T, 128>(a, f);
    case 256:
      return dispatch_addressing<T, 256>(a, f);
    default:
      return cudaErrorInvalidValue;
  }
}

template <class F>
cudaError_t dispatch(const AttentionShape& shape, KvAddressing a, F&& f) {
  if (!check_shape(shape).empty()) return cudaErrorInvalidValue;
  return shape.dtype == KvDtype::kBf16 ? dispatch_head_dim<__nv_bfloat16>(shape.head_dim, a, f)
                                       : dispatch_head_dim<__half>(shape.head_dim, a, f);
}

// dispatch with the KV cache's storage type too: `[&]<typename T, typename KV, int D, bool
// PAGED>()`, KV = T for kAuto, __nv_fp8_e4m3 or __nv_fp8_e5m2 for the fp8 caches.
template <class F>
cudaError_t dispatch_kv(const AttentionShape& shape, KvAddressing a, F&& f) {
  auto with = [&]<typename KV>() {
    return dispatch(shape, a, [&]<typename T, int D, bool PAGED>() {
      if constexpr (std::is_void_v<KV>) {
        return f.template operator()<T, T, D, PAGED>();
      } else {
        return f.template operator()<T, KV, D, PAGED>();
      }
    });
  };
  switch (shape.kv_cache) {
    case KvCacheDtype::kAuto:
      return with.template operator()<void>();
    case KvCacheDtype::kFp8E4m3:
      return with.template operator()<__nv_fp8_e4m3>();
    case KvCacheDtype::kFp8E5m2:
      return with.template operator()<__nv_fp8_e5m2>();
  }
  return cudaErrorInvalidValue;
}

// Whether the per-sequence tables a launch got are those its cache view needs: block tables
// (and a block size, and a block stride below 2^32 elements, which the kernels' 32-bit in-block
// offsets need) for paged addressing, slots for contiguous.
inline bool tables_match(const KvLayerView& cache, const SeqTables& seqs) {
  return cache.addressing == KvAddressing::kPaged
             ? cache.block_size != 0 && seqs.block_tables != nullptr && cache.block_stride > 0 &&
                   cache.block_stride <= int64_t{UINT32_MAX}
             : seqs.slots != nullptr;
}

// An fp8 cache's 16-byte copies need block (or slot) strides and bases of whole 16 bytes.
inline bool fp8_cache_aligned(const AttentionShape& shape, const KvLayerView& cache) {
  return !shape.kv_fp8() ||
         (cache.block_stride % 16 == 0 && cache.k % 16 == 0 && cache.v % 16 == 0);
}

// Raises a kernel's dynamic shared-memory limit once per kernel (needed above 48 KiB).
template <auto Kernel>
cudaError_t allow_smem(size_t bytes) {
  static const cudaError_t once = cudaFuncSetAttribute(
      Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  return once;
}

}  // namespace memsim::kernels::detail
