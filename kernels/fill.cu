// FillKernel and VerifyKernel: write / check the index-mixed 32-bit pattern of kernels/fill.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/fill.h"

namespace memsim {
namespace {

constexpr unsigned kThreads = 256;
constexpr uint64_t kMaxBlocks = 4096;

struct FillParams {
  uint8_t* ptr;
  uint64_t bytes;
  uint32_t pattern;
};

struct VerifyParams {
  const uint8_t* ptr;
  uint64_t bytes;
  uint32_t pattern;
  unsigned long long* counter;
};

// Same formula as fill_word() in fill.h, for device code.
__device__ __forceinline__ uint32_t word_value(uint32_t pattern, uint64_t index) {
  return pattern ^ (static_cast<uint32_t>(index) * 0x9E3779B1u);
}

__device__ __forceinline__ uint64_t thread_index() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ uint64_t thread_count() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

// Word `w` written byte by byte: any alignment, and the trailing partial word.
__device__ __forceinline__ void store_word_bytes(uint8_t* base, uint64_t bytes, uint64_t w,
                                                 uint32_t value) {
  for (uint64_t b = 0; b < 4 && 4 * w + b < bytes; ++b)
    base[4 * w + b] = static_cast<uint8_t>(value >> (8 * b));
}

__device__ __forceinline__ bool word_bytes_match(const uint8_t* base, uint64_t bytes, uint64_t w,
                                                 uint32_t value) {
  bool ok = true;
  for (uint64_t b = 0; b < 4 && 4 * w + b < bytes; ++b)
    ok = ok && base[4 * w + b] == static_cast<uint8_t>(value >> (8 * b));
  return ok;
}

__global__ void FillKernel(const __grid_constant__ FillParams p) {
  const uint64_t words = p.bytes / 4;
  const uint64_t all_words = (p.bytes + 3) / 4;  // including a trailing partial word
  const uint64_t tid = thread_index();
  const uint64_t stride = thread_count();
  const auto addr = reinterpret_cast<uintptr_t>(p.ptr);
  uint64_t done = 0;  // words [0, done) take the fast paths below
  if (addr % 16 == 0) {
    auto* v = reinterpret_cast<uint4*>(p.ptr);
    const uint64_t quads = words / 4;
    for (uint64_t q = tid; q < quads; q += stride) {
      const uint64_t w = 4 * q;
      v[q] = make_uint4(word_value(p.pattern, w), word_value(p.pattern, w + 1),
                        word_value(p.pattern, w + 2), word_value(p.pattern, w + 3));
    }
    done = 4 * quads;
  }
  if (addr % 4 == 0) {
    auto* s = reinterpret_cast<uint32_t*>(p.ptr);
    for (uint64_t w = done + tid; w < words; w += stride) s[w] = word_value(p.pattern, w);
    done = words;
  }
  for (uint64_t w = done + tid; w < all_words; w += stride)
    store_word_bytes(p.ptr, p.bytes, w, word_value(p.pattern, w));
}

__global__ void VerifyKernel(const __grid_constant__ VerifyParams p) {
  const uint64_t words = p.bytes / 4;
  const uint64_t all_words = (p.bytes + 3) / 4;
  const uint64_t tid = thread_index();
  const uint64_t stride = thread_count();
  const auto addr = reinterpret_cast<uintptr_t>(p.ptr);
  unsigned long long bad = 0;
  uint64_t done = 0;
  if (addr % 16 == 0) {
    const auto* v = reinterpret_cast<const uint4*>(p.ptr);
    const uint64_t quads = words / 4;
    for (uint64_t q = tid; q < quads; q += stride) {
      const uint64_t w = 4 * q;
      const uint4 x = v[q];
      bad += (x.x != word_value(p.pattern, w)) + (x.y != word_value(p.pattern, w + 1)) +
             (x.z != word_value(p.pattern, w + 2)) + (x.w != word_value(p.pattern, w + 3));
    }
    done = 4 * quads;
  }
  if (addr % 4 == 0) {
    const auto* s = reinterpret_cast<const uint32_t*>(p.ptr);
    for (uint64_t w = done + tid; w < words; w += stride) bad += s[w] != word_value(p.pattern, w);
    done = words;
  }
  for (uint64_t w = done + tid; w < all_words; w += stride)
    bad += !word_bytes_match(p.ptr, p.bytes, w, word_value(p.pattern, w));
  if (bad != 0) atomicAdd(p.counter, bad);
}

unsigned blocks_for(uint64_t bytes) {
  // One 16-byte vector per thread per iteration; grid-stride beyond kMaxBlocks.
  const uint64_t per_block = 16ull * kThreads;
  return static_cast<unsigned>(
      std::clamp<uint64_t>((bytes + per_block - 1) / per_block, 1, kMaxBlocks));
}

}  // namespace

cudaError_t launch_fill(void* stream, uint64_t ptr, uint64_t bytes, uint32_t pattern) {
  if (bytes == 0) return cudaSuccess;
  const FillParams p{reinterpret_cast<uint8_t*>(ptr), bytes, pattern};
  FillKernel<<<blocks_for(bytes), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_verify(void* stream, uint64_t ptr, uint64_t bytes, uint32_t pattern,
                          unsigned long long* d_counter) {
  if (bytes == 0) return cudaSuccess;
  const VerifyParams p{reinterpret_cast<const uint8_t*>(ptr), bytes, pattern, d_counter};
  VerifyKernel<<<blocks_for(bytes), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return cudaGetLastError();
}

}  // namespace memsim
