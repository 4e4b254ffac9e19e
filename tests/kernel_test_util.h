// Host helpers of the kernel tests: the no-GPU skip, a CUDA_OK check, bf16/fp16 rounding
// (nearest even) and device buffers with upload and download.
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/attention_types.h"

namespace memsim::kernels {

// The GPU tests' main() preamble: 77 (meson's "skipped") with a note on stderr when no CUDA
// device can be used, else 0. Usage: if (const int skip = skip_without_gpu()) return skip;
inline int skip_without_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "no CUDA device: skipped\n");
    return 77;
  }
  return 0;
}

#define CUDA_OK(expr)                              \
  do {                                             \
    const cudaError_t e_ = (expr);                 \
    INFO(#expr << ": " << cudaGetErrorString(e_)); \
    REQUIRE(e_ == cudaSuccess);                    \
  } while (0)

// ---- host half-precision conversions (round to nearest even) ----------------------------------

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t to_fp16(float f) {  // |f| < 65504, no NaN (test data)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  if (exp <= 0) {  // subnormal half
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}
inline float from_fp16(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else {
    const uint32_t u = ((static_cast<uint32_t>(exp) - 15 + 127) << 23) | (mant << 13);
    std::memcpy(&f, &u, 4);
  }
  return sign ? -f : f;
}
inline uint16_t to_half(KvDtype d, float f) {
  return d == KvDtype::kBf16 ? to_bf16(f) : to_fp16(f);
}
inline float from_half(KvDtype d, uint16_t h) {
  return d == KvDtype::kBf16 ? from_bf16(h) : from_fp16(h);
}

// ---- device buffers ----------------------------------------------------------------------------

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, count) * sizeof(T)) ==
            cudaSuccess);
  }
  explicit DevBuf(const std::vector<T>& v) : DevBuf(v.size()) { upload(v); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& v) {
    REQUIRE(v.size() <= n);
    CUDA_OK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(p); }
};

}  // namespace memsim::kernels
