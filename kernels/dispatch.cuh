// The one dispatch point of the attention kernels: run-time (dtype, head_dim, addressing) to
// template arguments. A launcher passes a generic lambda `[&]<typename T, int D, bool PAGED>()`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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

// Whether the per-sequence tables a launch got are those its cache view needs: block tables
// (and a block size) for paged addressing, slots for contiguous.
inline bool tables_match(const KvLayerView& cache, const SeqTables& seqs) {
  return cache.addressing == KvAddressing::kPaged
             ? cache.block_size != 0 && seqs.block_tables != nullptr
             : seqs.slots != nullptr;
}

// Raises a kernel's dynamic shared-memory limit once per kernel (needed above 48 KiB).
template <auto Kernel>
cudaError_t allow_smem(size_t bytes) {
  static const cudaError_t once = cudaFuncSetAttribute(
      Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  return once;
}

}  // namespace memsim::kernels::detail
