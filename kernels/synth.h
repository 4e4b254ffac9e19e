// The values memsim's GPU serving path gives K, V and Q: a deterministic function of two keys
// (token and position for K/V, request and step for Q), a salt (layer, K or V) and the element.
// Host and device share it, so CPU code can predict any element exactly.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MEMSIM_SYNTH_HD __host__ __device__ __forceinline__
#else
#define MEMSIM_SYNTH_HD inline
#endif

namespace memsim::kernels {

// Uniform in [-1, 1) on a grid of 2^-23: exact in float, so rounding it to bf16 or fp16 gives
// the same bits on the host and on the GPU.
MEMSIM_SYNTH_HD float synth_value(uint32_t a, uint32_t b, uint32_t salt, uint32_t element) {
  uint64_t z = (uint64_t{a} << 32 | b) ^ (uint64_t{salt} << 48) ^
               (uint64_t{element} * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.f / 16777216.f) - 1.f;
}

// Salts: K and V of a layer, Q of a layer.
MEMSIM_SYNTH_HD uint32_t synth_salt_k(uint32_t layer) {
  return 3 * layer;
}
MEMSIM_SYNTH_HD uint32_t synth_salt_v(uint32_t layer) {
  return 3 * layer + 1;
}
MEMSIM_SYNTH_HD uint32_t synth_salt_q(uint32_t layer) {
  return 3 * layer + 2;
}

}  // namespace memsim::kernels
