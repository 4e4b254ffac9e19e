// Host launchers for the fill and verify kernels (kernels/fill.cu); plain types, no CUDA C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace memsim {

// The value fill writes into 32-bit word `index` of a range (word i = bytes [4i, 4i+4) from the
// range's start, little-endian; a trailing partial word holds the low bytes of its value).
// Every word differs, so aliasing, stale pages and shifted mappings are all detectable.
constexpr uint32_t fill_word(uint32_t pattern, uint64_t index) {
  return pattern ^ (static_cast<uint32_t>(index) * 0x9E3779B1u);
}

// Enqueues FillKernel on `stream` (a cudaStream_t) over [ptr, ptr + bytes). Any alignment of
// `ptr` works (16-byte aligned ranges use vector stores). Returns the launch error, if any.
cudaError_t launch_fill(void* stream, uint64_t ptr, uint64_t bytes, uint32_t pattern);

// Enqueues VerifyKernel: adds to *d_counter (device memory) the number of words of
// [ptr, ptr + bytes) that differ from fill_word(pattern, index); a trailing partial word counts
// as one word. The caller zeroes the counter first and reads it after synchronizing.
cudaError_t launch_verify(void* stream, uint64_t ptr, uint64_t bytes, uint32_t pattern,
                          unsigned long long* d_counter);

}  // namespace memsim
