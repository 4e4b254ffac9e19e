// Division by a run-time constant with a multiply and a shift (Granlund-Montgomery), for page
// and block-size arithmetic on the GPU; the same code runs on the host so CPU tests check it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MEMSIM_HD __host__ __device__ __forceinline__
#else
#define MEMSIM_HD inline
#endif

namespace memsim::kernels {

// Exact quotient and remainder of n / d for 1 <= d and n < 2^31 (token positions and block ids):
// with s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1, n / d = (mulhi(n, m) + n) >> s,
// and n + mulhi(n, m) < 2^32 because mulhi(n, m) < n.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;

  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    s = 0;
    while ((uint64_t{1} << s) < divisor) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - divisor)) / divisor + 1);
  }

  MEMSIM_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, m);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * m) >> 32);
#endif
    return (hi + n) >> s;
  }
  MEMSIM_HD void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * d;
  }
};

}  // namespace memsim::kernels
