// The custom all-reduce kernels (custom_all_reduce.h): flag barriers over IPC-shared signal
// blocks, the one-stage and two-stage reductions of vLLM's csrc/custom_all_reduce.cuh, and their
// host launcher.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/custom_all_reduce.h"

namespace memsim::kernels {
namespace {

// Flag stores and loads across GPUs: volatile for the barriers that only order arrivals, release
// and acquire (system scope) where a peer must then see this rank's data writes.
__device__ __forceinline__ void st_flag_volatile(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%1], %0;" ::"r"(v), "l"(p));
}
__device__ __forceinline__ uint32_t ld_flag_volatile(uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void st_flag_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%1], %0;" ::"r"(v), "l"(p));
}
__device__ __forceinline__ uint32_t ld_flag_acquire(uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

struct Signals {
  CarSignal* peer[kCarMaxRanks];
};

// Every rank's block b arrives before any reads: thread r writes this call's flag into peer r's
// start[b][rank] and waits for peer r's in its own block.
template <int N>
__device__ __forceinline__ void barrier_at_start(const Signals& sg, CarSignal* self,
                                                 uint32_t rank) {
  const uint32_t flag = self->flag[blockIdx.x] + 1;
  if (threadIdx.x < N) {
    st_flag_volatile(&sg.peer[threadIdx.x]->start[blockIdx.x][rank], flag);
    while (ld_flag_volatile(&self->start[blockIdx.x][threadIdx.x]) != flag) {
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) self->flag[blockIdx.x] = flag;
}

// Every rank's block b has finished the stage before any goes on. kFinal: the kernel's last
// barrier (peers' reads of this rank's buffers are done); otherwise this rank's writes become
// visible to the peers that acquire the flag.
template <int N, bool kFinal>
__device__ __forceinline__ void barrier_at_end(const Signals& sg, CarSignal* self, uint32_t rank) {
  __syncthreads();
  const uint32_t flag = self->flag[blockIdx.x] + 1;
  if (threadIdx.x < N) {
    uint32_t* peer = &sg.peer[threadIdx.x]->end[blockIdx.x][rank];
    uint32_t* mine = &self->end[blockIdx.x][threadIdx.x];
    if constexpr (kFinal) {
      st_flag_volatile(peer, flag);
      while (ld_flag_volatile(mine) != flag) {
      }
    } else {
      st_flag_release(peer, flag);
      while (ld_flag_acquire(mine) != flag) {
      }
    }
  }
  if constexpr (!kFinal) __syncthreads();
  if (threadIdx.x == 0) self->flag[blockIdx.x] = flag;
}

template <typename T>
__device__ __forceinline__ float to_f(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}
template <typename T>
__device__ __forceinline__ T from_f(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(x);
  else
    return __float2half(x);
}

// Element-wise sum of 16 bytes (8 elements) of each of N buffers, in the order given, in fp32;
// rounded once to T.
template <typename T, int N>
__device__ __forceinline__ uint4 packed_reduce(const uint4* const* ptrs, uint64_t idx) {
  float acc[8];
  {
    const uint4 v = ptrs[0][idx];
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = to_f(e[j]);
  }
#pragma unroll
  for (int i = 1; i < N; ++i) {
    const uint4 v = ptrs[i][idx];
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += to_f(e[j]);
  }
  uint4 out;
  T* o = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = from_f<T>(acc[j]);
  return out;
}

struct KernelArgs {
  const CarRankPtrs* inputs;
  Signals sg;
  uint4* out;
  uint32_t rank;
  uint64_t packs;  // 16-byte units
};

// One stage: every rank sums every rank's input, in rank order (so every rank's result is the
// same bits), then waits until all have read before any buffer may change.
template <typename T, int N>
__global__ void __launch_bounds__(kCarThreads) CarOneStageKernel(KernelArgs a) {
  const uint4* ptrs[N];
#pragma unroll
  for (int i = 0; i < N; ++i) ptrs[i] = reinterpret_cast<const uint4*>(a.inputs->ptrs[i]);
  CarSignal* self = a.sg.peer[a.rank];
  barrier_at_start<N>(a.sg, self, a.rank);
  for (uint64_t idx = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < a.packs;
       idx += uint64_t{gridDim.x} * blockDim.x)
    a.out[idx] = packed_reduce<T, N>(ptrs, idx);
  barrier_at_end<N, true>(a.sg, self, a.rank);
}

// Two stages: rank r sums its part of every input (starting with its own) into its scratch,
// after the barrier every rank copies every rank's part into its result. The last rank's part
// takes the remainder.
template <typename T, int N>
__global__ void __launch_bounds__(kCarThreads) CarTwoStageKernel(KernelArgs a) {
  const uint64_t tid = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t part = a.packs / N;
  const uint64_t start = a.rank * part;
  const uint64_t end = a.rank == N - 1 ? a.packs : start + part;
  const uint64_t largest = part + a.packs % N;
  const uint4* ptrs[N];
  uint4* tmps[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint32_t target = (a.rank + i) % N;
    ptrs[i] = reinterpret_cast<const uint4*>(a.inputs->ptrs[target]);
    tmps[i] = reinterpret_cast<uint4*>(a.sg.peer[target] + 1);  // the scratch after the signal
  }
  CarSignal* self = a.sg.peer[a.rank];
  barrier_at_start<N>(a.sg, self, a.rank);
  for (uint64_t idx = start + tid; idx < end; idx += stride)
    tmps[0][idx - start] = packed_reduce<T, N>(ptrs, idx);
  barrier_at_end<N, false>(a.sg, self, a.rank);
  for (uint64_t idx = tid; idx < largest; idx += stride) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const uint32_t from = (a.rank + i) % N;
      if (from == N - 1 || idx < part) a.out[from * part + idx] = tmps[i][idx];
    }
  }
}

template <typename T, int N>
cudaError_t launch(const KernelArgs& a, bool two_stage, cudaStream_t stream) {
  const uint64_t want = (a.packs + kCarThreads - 1) / kCarThreads;
  const uint32_t blocks = static_cast<uint32_t>(want < kCarMaxBlocks ? want : kCarMaxBlocks);
  if (two_stage)
    CarTwoStageKernel<T, N><<<blocks, kCarThreads, 0, stream>>>(a);
  else
    CarOneStageKernel<T, N><<<blocks, kCarThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_ranks(uint32_t ranks, const KernelArgs& a, bool two_stage, cudaStream_t stream) {
  switch (ranks) {
    case 2:
      return launch<T, 2>(a, two_stage, stream);
    case 4:
      return launch<T, 4>(a, two_stage, stream);
    case 6:
      return launch<T, 6>(a, two_stage, stream);
    case 8:
      return launch<T, 8>(a, two_stage, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool custom_all_reduce_two_stage(uint32_t ranks, uint64_t bytes) {
  if (ranks <= 2) return false;
  if (ranks <= 4) return bytes >= 512 * 1024;
  return bytes >= 256 * 1024;
}

cudaError_t custom_all_reduce(KvDtype dtype, const CustomAllReduceParams& p, cudaStream_t stream) {
  if (p.elems == 0) return cudaSuccess;
  if (p.rank >= p.ranks || p.elems % 8 != 0 || !p.inputs || p.out % 16 != 0 || p.out == 0)
    return cudaErrorInvalidValue;
  KernelArgs a{};
  a.inputs = p.inputs;
  for (uint32_t r = 0; r < p.ranks && r < kCarMaxRanks; ++r) {
    if (p.signals[r] == 0 || p.signals[r] % 128 != 0) return cudaErrorInvalidValue;
    a.sg.peer[r] = reinterpret_cast<CarSignal*>(p.signals[r]);
  }
  a.out = reinterpret_cast<uint4*>(p.out);
  a.rank = p.rank;
  a.packs = p.elems / 8;
  return dtype == KvDtype::kBf16 ? launch_ranks<__nv_bfloat16>(p.ranks, a, p.two_stage, stream)
                                 : launch_ranks<__half>(p.ranks, a, p.two_stage, stream);
}

}  // namespace memsim::kernels
