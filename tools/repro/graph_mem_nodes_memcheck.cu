// Standalone reproducer (CUDA runtime only) of a compute-sanitizer memcheck false positive on
// graph memory nodes: inside one captured graph, an allocation freed in the graph and a later,
// smaller allocation the graph does not free, at the same virtual address (the driver's address
// reuse within a graph), make memcheck report the first allocation's in-bounds writes as out of
// bounds of the second one. See docs/sanitizers.md.
//   nvcc -O2 -arch=sm_90 -o repro tools/repro/graph_mem_nodes_memcheck.cu
//   ./repro minimal [FIRST SECOND] [--no-prior] [--free-second]   (see minimal() below)
//   ./repro hold|release [GRAPHS]     memsim's recorded program (below)
//   ./repro file PATH hold|release    another program, one op per line: B (begin capture),
//                                     A ID BYTES (alloc + fill), F ID (free), L (end + launch);
//                                     a delta-debugging loop over this mode found the minimal one
//   compute-sanitizer --tool memcheck ./repro minimal 3072 2048
// The recorded program is what memsim's capture runner does for graph_mem_nodes (tiny Llama
// shape, batch 1, piecewise graphs): hold keeps every graph's outputs live to the end
// (OutputLifetime::kStrong), release frees each graph's outputs right after its launch. Both
// print every allocation's VA, check that no allocation overlaps a held output of another graph,
// and verify every held output's contents after the last launch.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

enum class Op { kBegin, kAlloc, kFree, kEndLaunch };
struct Step {
  Op op;
  int id;          // allocation id (kAlloc, kFree)
  uint64_t bytes;  // kAlloc
};

// Recorded from memsim's runner on the sim backend (graph_mem_nodes, piecewise, batch 1 of a
// 4-layer model with hidden 1024, 8 heads, 2 KV heads, intermediate 2816).
const Step kProgram[] = {
#include "graph_mem_nodes_ops.inc"
};

__global__ void fill(uint4* p, uint64_t quads, uint32_t pattern) {
  for (uint64_t q = blockIdx.x * blockDim.x + threadIdx.x; q < quads;
       q += uint64_t(gridDim.x) * blockDim.x)
    p[q] = make_uint4(pattern, pattern + 1, pattern + 2, uint32_t(q));
}

// An empty graph launched first (unless no_prior), then one graph: alloc FIRST, fill it, free
// it, alloc SECOND (the driver gives it FIRST's address when it fits), fill it, and free it in
// the graph (free_second) or after the launch, outside the graph (an output the caller holds).
int minimal(uint64_t first, uint64_t second, bool prior, bool free_second) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g0 = nullptr;
  cudaGraphExec_t x0 = nullptr;
  if (prior) {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CK(cudaStreamEndCapture(s, &g0));
    CK(cudaGraphInstantiateWithFlags(&x0, g0, 0));
    CK(cudaGraphLaunch(x0, s));
  }
  void* a = nullptr;
  void* b = nullptr;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CK(cudaMallocAsync(&a, first, s));
  fill<<<1, 256, 0, s>>>(static_cast<uint4*>(a), first / 16, 0xA000u);
  CK(cudaFreeAsync(a, s));
  CK(cudaMallocAsync(&b, second, s));
  fill<<<1, 256, 0, s>>>(static_cast<uint4*>(b), second / 16, 0xB000u);
  if (free_second) CK(cudaFreeAsync(b, s));
  cudaGraph_t g;
  cudaGraphExec_t x;
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiateWithFlags(&x, g, 0));
  std::printf("minimal: %s; first %lu bytes at %p, second %lu bytes at %p (%s), second freed %s\n",
              prior ? "after an empty graph's launch" : "first graph", first, a, second, b,
              a == b ? "same address" : "different addresses",
              free_second ? "in the graph" : "after the launch");
  CK(cudaGraphLaunch(x, s));
  if (!free_second) CK(cudaFreeAsync(b, s));
  CK(cudaStreamSynchronize(s));
  std::printf("minimal: launched and synchronized without error\n");
  CK(cudaGraphExecDestroy(x));
  CK(cudaGraphDestroy(g));
  if (prior) {
    CK(cudaGraphExecDestroy(x0));
    CK(cudaGraphDestroy(g0));
  }
  CK(cudaStreamDestroy(s));
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "minimal") == 0) {
    CK(cudaSetDevice(0));
    bool prior = true, free_second = false;
    std::vector<uint64_t> sizes;
    for (int i = 2; i < argc; ++i) {
      if (std::strcmp(argv[i], "--no-prior") == 0)
        prior = false;
      else if (std::strcmp(argv[i], "--free-second") == 0)
        free_second = true;
      else
        sizes.push_back(std::strtoull(argv[i], nullptr, 0));
    }
    return minimal(sizes.size() > 0 ? sizes[0] : 3072, sizes.size() > 1 ? sizes[1] : 2048, prior,
                   free_second);
  }
  std::vector<Step> program(std::begin(kProgram), std::end(kProgram));
  if (argc > 2 && std::strcmp(argv[1], "file") == 0) {  // B | A id bytes | F id | L per line
    program.clear();
    FILE* f = std::fopen(argv[2], "r");
    if (f == nullptr) return 2;
    char k;
    while (std::fscanf(f, " %c", &k) == 1) {
      Step st{Op::kBegin, 0, 0};
      unsigned long long bytes = 0;
      if (k == 'A' && std::fscanf(f, "%d %llu", &st.id, &bytes) == 2)
        st = {Op::kAlloc, st.id, bytes};
      else if (k == 'F' && std::fscanf(f, "%d", &st.id) == 1)
        st.op = Op::kFree;
      else if (k == 'L')
        st.op = Op::kEndLaunch;
      else if (k != 'B')
        return 2;
      program.push_back(st);
    }
    std::fclose(f);
    argv += 2;
    argc -= 2;
  }
  const bool hold = argc < 2 || std::strcmp(argv[1], "release") != 0;
  const int max_graphs = argc > 2 ? std::atoi(argv[2]) : 1 << 30;
  cudaStream_t s;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct Alloc {
    void* p;
    uint64_t bytes;
    int graph;
    bool live;
  };
  std::map<int, Alloc> allocs;
  std::vector<cudaGraphExec_t> execs;
  int graph = 0;
  for (const Step& st : program) {
    if (st.op == Op::kBegin) {
      if (++graph > max_graphs) break;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    } else if (st.op == Op::kAlloc) {
      void* p = nullptr;
      CK(cudaMallocAsync(&p, st.bytes, s));
      const auto a = reinterpret_cast<uintptr_t>(p);
      for (const auto& [id, o] : allocs) {
        const auto b = reinterpret_cast<uintptr_t>(o.p);
        if (o.live && o.graph != graph && a < b + o.bytes && b < a + st.bytes)
          std::printf(
              "  OVERLAP: G%d alloc %d [%#lx,+%lu) overlaps held G%d alloc %d [%#lx,+%lu)\n", graph,
              st.id, a, st.bytes, o.graph, id, b, o.bytes);
      }
      allocs[st.id] = Alloc{p, st.bytes, graph, true};
      fill<<<1, 256, 0, s>>>(static_cast<uint4*>(p), st.bytes / 16, 0x1000u * st.id);
      CK(cudaGetLastError());
      std::printf("G%d alloc %2d %#lx %lu\n", graph, st.id, a, st.bytes);
    } else if (st.op == Op::kFree) {
      CK(cudaFreeAsync(allocs[st.id].p, s));
      allocs[st.id].live = false;
    } else {
      cudaGraph_t g;
      cudaGraphExec_t x;
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiateWithFlags(&x, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
      CK(cudaGraphDestroy(g));
      CK(cudaGraphLaunch(x, s));
      CK(cudaStreamSynchronize(s));
      std::printf("G%d launched\n", graph);
      execs.push_back(x);
      if (!hold)
        for (auto& [id, a] : allocs)
          if (a.live && a.graph == graph) {
            CK(cudaFreeAsync(a.p, s));
            a.live = false;
          }
    }
  }
  CK(cudaStreamSynchronize(s));
  int bad = 0;
  for (auto& [id, a] : allocs) {
    if (!a.live) continue;
    std::vector<uint4> h(a.bytes / 16);
    CK(cudaMemcpy(h.data(), a.p, a.bytes, cudaMemcpyDeviceToHost));
    const uint32_t pattern = 0x1000u * id;
    for (size_t q = 0; q < h.size(); ++q)
      if (h[q].x != pattern || h[q].w != q) {
        std::printf("held output %d (G%d) overwritten at quad %zu\n", id, a.graph, q);
        ++bad;
        break;
      }
    CK(cudaFreeAsync(a.p, s));
  }
  CK(cudaStreamSynchronize(s));
  for (cudaGraphExec_t x : execs) CK(cudaGraphExecDestroy(x));
  CK(cudaDeviceGraphMemTrim(0));
  std::printf("%s: %d graphs, %d held outputs overwritten\n", hold ? "hold" : "release", graph,
              bad);
  return bad ? 3 : 0;
}
