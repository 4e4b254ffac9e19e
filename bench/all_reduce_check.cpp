// memsim-model-bench --all-reduce-check: the custom all-reduce against a host reference and
// NCCL on every rank (eager, and replayed from a CUDA graph after its inputs changed), then both
// timed inside CUDA graphs as a decode step runs them.
#include "bench/all_reduce_check.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/custom_all_reduce.h"
#include "src/exec/tp_group.h"
#include "workload/collectives.h"

namespace memsim::bench {
namespace {

using kernels::KvDtype;

uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest even (no NaNs here)
  return static_cast<uint16_t>(bits >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Rank r's input of `elems` values for data set `set`: multiples of 1/64 in [-2, 2] (exact in
// bf16), the same on every rank that makes it.
std::vector<uint16_t> input_of(uint32_t r, uint64_t elems, uint32_t set) {
  std::mt19937_64 rng(uint64_t{r} * 7919 + elems * 31 + set);
  std::uniform_int_distribution<int> d(-128, 128);
  std::vector<uint16_t> v(elems);
  for (auto& x : v) x = to_bf16(static_cast<float>(d(rng)) / 64.0f);
  return v;
}

// What the kernel computes: fp32 sums in its order (one stage: ranks 0..n-1; two stages: the
// owner of the element's part first, then the ranks after it), rounded once.
std::vector<uint16_t> reference(uint32_t ranks, uint64_t elems, uint32_t set) {
  std::vector<std::vector<uint16_t>> in;
  for (uint32_t r = 0; r < ranks; ++r) in.push_back(input_of(r, elems, set));
  const bool two = kernels::custom_all_reduce_two_stage(ranks, elems * 2);
  const uint64_t packs = elems / 8, part = packs / ranks;
  std::vector<uint16_t> out(elems);
  for (uint64_t i = 0; i < elems; ++i) {
    const uint32_t owner =
        two ? static_cast<uint32_t>(std::min<uint64_t>(i / 8 / part, ranks - 1)) : 0;
    float acc = 0;
    for (uint32_t k = 0; k < ranks; ++k) {
      const float x = from_bf16(in[(owner + k) % ranks][i]);
      acc = k == 0 ? x : acc + x;
    }
    out[i] = to_bf16(acc);
  }
  return out;
}

struct Buffers {
  void* in = nullptr;
  void* out = nullptr;
  ~Buffers() {
    if (in) cudaFree(in);
    if (out) cudaFree(out);
  }
};

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("  CUDA error in %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

bool ok(const Status& s, const char* what) {
  if (s.ok()) return true;
  std::printf("  %s failed: %s\n", what, s.error().message.c_str());
  return false;
}

std::vector<uint16_t> fetch(const void* p, uint64_t elems) {
  std::vector<uint16_t> v(elems);
  (void)cudaMemcpy(v.data(), p, elems * 2, cudaMemcpyDeviceToHost);
  return v;
}

uint64_t mismatches(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  uint64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

double max_diff(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(double(from_bf16(a[i])) - double(from_bf16(b[i]))));
  return m;
}

// One size: custom eager and graph (inputs changed before the replay) bit for bit against the
// reference, NCCL's difference from it. Returns whether the custom results were exact.
bool check_size(TpGroup& custom, TpGroup& nccl, const Buffers& b, uint64_t elems, cudaStream_t s,
                bool lead) {
  const uint32_t ranks = custom.size(), rank = custom.rank();
  const auto in = reinterpret_cast<uint64_t>(b.in), out = reinterpret_cast<uint64_t>(b.out);
  const auto stream = reinterpret_cast<uint64_t>(s);
  auto load = [&](uint32_t set) {
    const std::vector<uint16_t> v = input_of(rank, elems, set);
    return ok(cudaMemcpy(b.in, v.data(), elems * 2, cudaMemcpyHostToDevice), "upload");
  };
  bool good = load(0) && ok(custom.all_reduce(KvDtype::kBf16, in, out, elems, stream), "custom") &&
              ok(cudaStreamSynchronize(s), "custom eager");
  const std::vector<uint16_t> ref0 = reference(ranks, elems, 0);
  const uint64_t eager_bad = good ? mismatches(fetch(b.out, elems), ref0) : elems;
  good = good && ok(nccl.all_reduce(KvDtype::kBf16, in, out, elems, stream), "nccl") &&
         ok(cudaStreamSynchronize(s), "nccl");
  const double nccl_diff = good ? max_diff(fetch(b.out, elems), ref0) : -1;
  // The graph: captured over set 0's buffers, replayed after set 1 was written into them.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  good = good && ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "begin capture");
  if (good) {
    const Status st = custom.all_reduce(KvDtype::kBf16, in, out, elems, stream);
    good = ok(cudaStreamEndCapture(s, &graph), "end capture") && ok(st, "custom (captured)");
  }
  good = good && ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate") &&
         ok(custom.register_graph_buffers(), "register_graph_buffers") && load(1) &&
         ok(cudaMemset(b.out, 0, elems * 2), "memset") && ok(cudaGraphLaunch(exec, s), "replay") &&
         ok(cudaStreamSynchronize(s), "replay");
  const uint64_t graph_bad =
      good ? mismatches(fetch(b.out, elems), reference(ranks, elems, 1)) : elems;
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  custom.release_graph_buffers();
  const bool custom_path = elems * 2 < kCustomAllReduceMaxSize && elems % 8 == 0;
  if (lead || eager_bad || graph_bad)
    std::printf(
        "  rank %u, %8llu elements (%s): custom eager %s, graph replay %s; NCCL max |diff| "
        "%.3g\n",
        rank, static_cast<unsigned long long>(elems),
        !custom_path ? "over max_size: NCCL, not compared"
        : kernels::custom_all_reduce_two_stage(ranks, elems * 2) ? "two-stage"
                                                                 : "one-stage",
        eager_bad ? fmt::format("{} differ", eager_bad).c_str() : "exact",
        graph_bad ? fmt::format("{} differ", graph_bad).c_str() : "exact", nccl_diff);
  // Over max_size the custom group runs NCCL, whose order is its own.
  return good && (!custom_path || (eager_bad == 0 && graph_bad == 0));
}

// Median microseconds per all-reduce of `bytes` inside a graph of 20 (as tools/
// collective_bench.py times NCCL), the slowest rank's.
Result<double> graph_time_us(TpGroup& g, const Buffers& b, uint64_t bytes, cudaStream_t s) {
  constexpr int kCalls = 20;
  if (cudaMemset(b.in, 0, bytes) != cudaSuccess)
    return make_error(ErrorCode::kDriverError, "cudaMemset of the timed buffer");
  const auto in = reinterpret_cast<uint64_t>(b.in), out = reinterpret_cast<uint64_t>(b.out);
  const auto stream = reinterpret_cast<uint64_t>(s);
  MEMSIM_TRY(g.all_reduce(KvDtype::kBf16, in, out, bytes / 2, stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  Status st;
  for (int i = 0; i < kCalls && st.ok(); ++i)
    st = g.all_reduce(KvDtype::kBf16, in, out, bytes / 2, stream);
  const cudaError_t e = cudaStreamEndCapture(s, &graph);
  MEMSIM_TRY(st);
  if (e != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
    return make_error(ErrorCode::kDriverError, "capture of the timed all-reduces");
  cudaGraphDestroy(graph);
  MEMSIM_TRY(g.register_graph_buffers());
  cudaEvent_t a, z;
  cudaEventCreate(&a);
  cudaEventCreate(&z);
  for (int i = 0; i < 3; ++i) cudaGraphLaunch(exec, s);
  cudaStreamSynchronize(s);
  std::vector<double> us;
  for (int i = 0; i < 10; ++i) {
    MEMSIM_ASSIGN_OR_RETURN(const uint64_t together, g.host_max(0));  // a barrier
    (void)together;
    cudaEventRecord(a, s);
    cudaGraphLaunch(exec, s);
    cudaEventRecord(z, s);
    cudaEventSynchronize(z);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, z);
    us.push_back(ms * 1000.0 / kCalls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(z);
  cudaGraphExecDestroy(exec);
  g.release_graph_buffers();
  if (cudaGetLastError() != cudaSuccess)
    return make_error(ErrorCode::kDriverError, "timed all-reduces failed");
  std::sort(us.begin(), us.end());
  const double median = (us[4] + us[5]) / 2;
  MEMSIM_ASSIGN_OR_RETURN(const uint64_t slowest_ns,
                          g.host_max(static_cast<uint64_t>(median * 1000)));
  return double(slowest_ns) / 1000.0;
}

}  // namespace

int all_reduce_check(Nccl& nccl, uint32_t ranks, uint32_t rank) {
  const bool lead = rank == 0;
  auto custom = make_custom_all_reduce_group(nccl, ranks, rank);
  if (!custom.ok()) {
    std::printf("memsim-model-bench: custom all-reduce: %s\n", custom.error().message.c_str());
    return 1;
  }
  std::unique_ptr<TpGroup> nccl_group = make_nccl_group(nccl, ranks, rank);
  cudaStream_t s = nullptr;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream")) return 1;
  if (lead) std::printf("custom all-reduce at %u ranks, bf16, against the host's sums:\n", ranks);
  // One pair of buffers for every size: a registered input stays allocated while any peer maps
  // it (as vLLM's graph inputs live in their pool).
  Buffers b;
  if (!ok(cudaMalloc(&b.in, kCustomAllReduceMaxSize + 64), "cudaMalloc") ||
      !ok(cudaMalloc(&b.out, kCustomAllReduceMaxSize + 64), "cudaMalloc"))
    return 1;
  bool all = true;
  // A token's hidden (Qwen2.5-32B 5120), decode batches, the two-stage switch at 512 KiB and
  // 256 KiB, an odd multiple of 8, just under and at max_size (NCCL there).
  for (uint64_t elems : {8ull, 5120ull, 5128ull, 40960ull, 131064ull, 131072ull, 262144ull,
                         655360ull, 1048576ull, 4194296ull, 4194304ull})
    all = check_size(**custom, *nccl_group, b, elems, s, lead) && all;
  if (lead) std::printf("all-reduce times inside CUDA graphs (median us a call, slowest rank):\n");
  std::string row_c, row_n;
  for (uint64_t bytes = 2048; bytes < kCustomAllReduceMaxSize; bytes *= 2) {
    Result<double> c = graph_time_us(**custom, b, bytes, s);
    Result<double> n = graph_time_us(*nccl_group, b, bytes, s);
    if (!c.ok() || !n.ok()) {
      std::printf("  timing %llu bytes failed: %s\n", static_cast<unsigned long long>(bytes),
                  (!c.ok() ? c.error() : n.error()).message.c_str());
      return 1;
    }
    if (lead)
      std::printf("  %8llu bytes: custom %7.2f us, NCCL %7.2f us (custom / NCCL %.2f)\n",
                  static_cast<unsigned long long>(bytes), *c, *n, *c / *n);
    row_c += fmt::format("{}{:.1f}", row_c.empty() ? "" : ", ", *c);
    row_n += fmt::format("{}{:.1f}", row_n.empty() ? "" : ", ", *n);
  }
  if (lead)
    std::printf("custom_all_reduce_us:\n    %u: [%s]\n(NCCL in the same run: [%s])\n", ranks,
                row_c.c_str(), row_n.c_str());
  cudaStreamDestroy(s);
  if (lead || !all) std::printf("all-reduce check: %s\n", all ? "passed" : "FAILED");
  return all ? 0 : 1;
}

}  // namespace memsim::bench
