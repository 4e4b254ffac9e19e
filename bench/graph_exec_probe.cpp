// memsim-graph-exec-probe: the device memory the driver takes for each instantiated CUDA graph,
// beyond any allocation, by the graph's kernel nodes (cudaMemGetInfo around instantiation,
// upload, first launch and destruction of many copies). Exits 77 without a GPU.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/fill.h"

namespace {

constexpr int kExecs = 32;  // copies of each graph: 2 MiB steps of cudaMemGetInfo, shared out

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("memsim-graph-exec-probe: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

long long free_bytes() {
  size_t f = 0, t = 0;
  cudaDeviceSynchronize();
  cudaMemGetInfo(&f, &t);
  return static_cast<long long>(f);
}

// One row: a graph of `nodes` fill kernels captured, instantiated kExecs times.
bool probe(int nodes, cudaStream_t s, void* buf) {
  cudaGraph_t g = nullptr;
  if (!ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "begin capture")) return false;
  for (int i = 0; i < nodes; ++i)
    memsim::launch_fill(s, reinterpret_cast<uint64_t>(buf), 256, static_cast<uint32_t>(i));
  if (!ok(cudaStreamEndCapture(s, &g), "end capture")) return false;
  std::vector<cudaGraphExec_t> execs(kExecs, nullptr);
  const long long f0 = free_bytes();
  for (auto& e : execs)
    if (!ok(cudaGraphInstantiate(&e, g, 0), "instantiate")) return false;
  const long long f1 = free_bytes();
  for (auto& e : execs)
    if (!ok(cudaGraphUpload(e, s), "upload")) return false;
  const long long f2 = free_bytes();
  for (auto& e : execs)
    if (!ok(cudaGraphLaunch(e, s), "launch")) return false;
  const long long f3 = free_bytes();
  for (auto& e : execs) cudaGraphExecDestroy(e);
  const long long f4 = free_bytes();
  cudaGraphDestroy(g);
  auto per = [](long long a, long long b) { return double(a - b) / kExecs / 1024.0; };
  std::printf(
      "%6d nodes: KiB per graph after instantiate %8.1f, upload %8.1f, launch %8.1f; "
      "destroyed: %8.1f KiB per graph back\n",
      nodes, per(f0, f1), per(f0, f2), per(f0, f3), per(f4, f3));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("memsim-graph-exec-probe: no GPU\n");
    return 77;
  }
  std::vector<int> nodes = {1, 8, 64, 256, 512, 1024, 2048, 4096};
  if (argc > 1) {
    nodes.clear();
    for (int i = 1; i < argc; ++i) nodes.push_back(std::atoi(argv[i]));
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0;
  cudaDriverGetVersion(&driver);
  std::printf("memsim-graph-exec-probe: %s, driver %d; %d copies of each graph, fill kernels\n",
              prop.name, driver, kExecs);
  cudaStream_t s = nullptr;
  void* buf = nullptr;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream") ||
      !ok(cudaMalloc(&buf, 4096), "cudaMalloc"))
    return 1;
  // Warm-up: the context's own first-graph setup is not a graph's.
  if (!probe(1, s, buf)) return 1;
  std::printf("(above: warm-up)\n");
  for (int n : nodes)
    if (!probe(n, s, buf)) return 1;
  return 0;
}
