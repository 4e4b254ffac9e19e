// Hopper primitives: mbarriers, cp.async completion on an mbarrier and TMA tile loads (sm_90: the
// fp8 decode's KV tiles), and for the wgmma prefill kernel (sm_90a) register reallocation,
// shared-memory matrix descriptors (128-byte swizzle) and the m64n128k16 warpgroup MMAs (A from
// shared memory or registers, f32 accumulators).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda.h>  // CUtensorMap

#include <cstdint>
#include <type_traits>

namespace memsim::kernels::detail::sm90 {

// ---- mbarriers ---------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// This thread's arrival, which also raises the phase's expected transaction bytes by `bytes`
// (the TMA loads completing on this barrier count them down).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Makes mbarrier.init visible to the async proxy (the TMA unit) before the barrier is used.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// TMA: the box of a 4-D tensor map (a __grid_constant__ kernel parameter) at coordinates
// (c0, c1, c2, c3) into shared memory at `dst`, completing `bar`'s transaction bytes. Boxes
// past the tensor's extent are zero-filled.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// The barrier's arrival (counted in its expected count: .noinc) once this thread's earlier
// cp.async copies have landed.
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// 16 bytes from global to the shared address `dst` (L2 only); zero-filled when `valid` is false
// (the source is then not read).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, %2, 0;\ncp.async.cg.shared.global [%0], [%1], 16, "
      "p;\n}\n" ::"r"(dst),
      "l"(src), "r"(static_cast<uint32_t>(valid)));
}
// Orders shared memory written through the generic proxy (cp.async, stores) before the tensor
// cores' async-proxy reads that follow.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier among `threads` threads (whole warps) under id `id` (0 is __syncthreads').
__device__ __forceinline__ void named_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrival at barrier `id` without waiting (the waiting side counts it in `threads`).
__device__ __forceinline__ void named_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- wgmma -------------------------------------------------------------------------------------

// Descriptor of a shared-memory operand in the 128-byte swizzle (layout type 1, bits 62-63):
// start address, leading and stride byte offsets, each in 16-byte units. Tiles start on 1024-byte
// boundaries (base offset 0), so k-steps inside a 128-byte row just advance the start address.
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t{(addr & 0x3ffffu) >> 4} | (uint64_t{lbo >> 4} << 16) |
         (uint64_t{sbo >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of these registers across an async MMA's issue
// and its wait (they are in flight in between).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#define MEMSIM_WG_ACC                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define MEMSIM_WG_OUTS                                                                            \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
// D (64 x 128, f32) = A (64 x 16, K-major in shared memory) x B (16 x 128, K-major) + D when
// accumulate, else A x B.
#define MEMSIM_WG_SS(TY)                                                         \
  asm volatile(                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                               \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " MEMSIM_WG_ACC \
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                          \
      : MEMSIM_WG_OUTS                                                           \
      : "l"(a), "l"(b), "r"(accumulate))
// D += A (64 x 16 from registers, the mma.sync A fragment of each warp's 16 rows) x B (16 x 128,
// MN-major in shared memory: transposed).
#define MEMSIM_WG_RS(TY)                                                         \
  asm volatile(                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                               \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " MEMSIM_WG_ACC \
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                            \
      : MEMSIM_WG_OUTS                                                           \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1u))

template <typename T>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t a, uint64_t b,
                                         uint32_t accumulate) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    MEMSIM_WG_SS("bf16");
  } else {
    MEMSIM_WG_SS("f16");
  }
}

template <typename T>
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    MEMSIM_WG_RS("bf16");
  } else {
    MEMSIM_WG_RS("f16");
  }
}

#undef MEMSIM_WG_SS
#undef MEMSIM_WG_RS
#undef MEMSIM_WG_OUTS
#undef MEMSIM_WG_ACC

}  // namespace memsim::kernels::detail::sm90
