// Probe of the device memory a process holds before its first allocation (the GPU file's
// `context:` term): the CUDA context, then a cuBLASLt handle, then the first cudaMalloc.
// Build: nvcc -O2 -arch=sm_90 -o context_memory tools/repro/context_memory.cu -lcublasLt
// Prints "<key> <bytes>" lines: total, free at each step, and what each step took.
// Run on an otherwise idle GPU (nvidia-smi shows no other process). Exits 77 without a GPU.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

size_t free_now() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) std::exit(1);
  return free_b;
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 77;
  if (cudaFree(nullptr) != cudaSuccess) return 1;  // creates the primary context
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 1;
  std::printf("total %zu\nfree_after_context %zu\ncontext %zu\n", total_b, free_b,
              total_b - free_b);
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
  const size_t after_lt = free_now();
  std::printf("cublaslt_handle %zu\n", free_b - after_lt);
  void* p = nullptr;
  if (cudaMalloc(&p, 2u << 20) != cudaSuccess) return 1;
  const size_t after_malloc = free_now();
  std::printf("first_malloc_2mib %zu\n", after_lt - after_malloc);
  if (cudaFree(p) != cudaSuccess) return 1;
  std::printf("after_free %zu\n", after_lt - free_now());
  cublasLtDestroy(lt);
  return 0;
}
