// Probe: do weights read as fast after the process has freed and re-allocated most of the GPU
// as they do in a fresh process? Mimics serving_measured's runs in one process: each "run"
// allocates Llama-3.1-8B's bf16 weights (one cudaMalloc a tensor, or one 16 GiB buffer with
// `whole`), then a KV pool of most of what is left, times reads of every tensor in turn (one
// kernel each, as a decode step's GEMVs read them), and frees everything.
// Build: nvcc -O2 -arch=sm_90 -o realloc_bandwidth tools/repro/realloc_bandwidth.cu
// Usage: realloc_bandwidth [runs] [tensors|whole]. Prints "run <i> weights_read_gbps <median>
// <min> <max>" per run. Exits 77 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

__global__ void read_all(const uint4* p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; almost never taken
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

// Llama-3.1-8B's tensors in bytes (bf16): embedding, 32 x (norm, qkv, o, norm, gate_up, down),
// final norm, LM head.
std::vector<size_t> llama_tensors() {
  const size_t h = 4096, vocab = 128256, inter = 14336, qkv = 4096 + 2 * 1024;
  std::vector<size_t> t{vocab * h * 2};
  for (int l = 0; l < 32; ++l)
    for (size_t b : {h * 2, h * qkv * 2, h * h * 2, h * 2, h * 2 * inter * 2, inter * h * 2})
      t.push_back(b);
  t.push_back(h * 2);
  t.push_back(vocab * h * 2);
  return t;
}

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 77;
  const int runs = argc > 1 ? std::atoi(argv[1]) : 4;
  const bool whole = argc > 2 && std::string(argv[2]) == "whole";
  const std::vector<size_t> sizes = llama_tensors();
  size_t weights = 0;
  for (size_t b : sizes) weights += b;
  const size_t headroom = size_t{4} << 30;
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(unsigned)), "sink");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int r = 0; r < runs; ++r) {
    std::vector<void*> w;
    if (whole) {
      w.push_back(nullptr);
      check(cudaMalloc(&w[0], weights), "weights");
    } else {
      for (size_t bytes : sizes) {
        w.push_back(nullptr);
        check(cudaMalloc(&w.back(), bytes), "weight");
      }
    }
    void* pool = nullptr;
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "meminfo");
    const size_t pool_bytes = free_b > headroom ? free_b - headroom : 0;
    if (pool_bytes) check(cudaMalloc(&pool, pool_bytes), "pool");
    for (size_t i = 0; i < w.size(); ++i)
      check(cudaMemset(w[i], r + 1, whole ? weights : sizes[i]), "memset");
    std::vector<float> gbps;
    for (int i = 0; i < 23; ++i) {
      check(cudaEventRecord(a), "record");
      for (size_t k = 0; k < w.size(); ++k) {
        const size_t bytes = whole ? weights : sizes[k];
        read_all<<<sms * 8, 512>>>(static_cast<const uint4*>(w[k]), bytes / 16, sink);
      }
      check(cudaEventRecord(b), "record");
      check(cudaEventSynchronize(b), "sync");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, a, b), "elapsed");
      if (i >= 3) gbps.push_back(float(double(weights) / (ms * 1e6)));
    }
    std::sort(gbps.begin(), gbps.end());
    std::printf("run %d weights_read_gbps %.1f %.1f %.1f (%s, %zu tensors, pool %.1f GiB)\n", r,
                gbps[gbps.size() / 2], gbps.front(), gbps.back(), whole ? "whole" : "tensors",
                w.size(), double(pool_bytes) / (1 << 30));
    std::fflush(stdout);
    for (void* p : w) check(cudaFree(p), "free weight");
    if (pool) check(cudaFree(pool), "free pool");
  }
  return 0;
}
