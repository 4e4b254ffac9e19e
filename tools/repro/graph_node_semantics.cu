// Probe of the driver's graph memory node semantics (CUDA runtime only): AutoFreeOnLaunch,
// address reuse inside a graph, graphs on two streams, fork/join capture, remap, upload.
// Build: nvcc -O2 -arch=sm_90 -o graph_node_semantics tools/repro/graph_node_semantics.cu
// Prints one line per observation: "<scenario> <key> <value>". Exits 77 without a GPU.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

constexpr size_t MiB = 1ull << 20;

__global__ void touch(char* p, size_t n) {
  for (size_t i = (blockIdx.x * blockDim.x + threadIdx.x) * 4096; i < n;
       i += (size_t)gridDim.x * blockDim.x * 4096)
    p[i] = 1;
}

void use(void* p, size_t n, cudaStream_t s) {
  touch<<<64, 128, 0, s>>>((char*)p, n);
}

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

uint64_t attr(cudaGraphMemAttributeType a) {
  uint64_t v = 0;
  CK(cudaDeviceGetGraphMemAttribute(0, a, &v));
  return v;
}
void mem(const char* sc, const char* when) {
  std::printf("%s %s reserved_MiB %.1f used_MiB %.1f\n", sc, when,
              attr(cudaGraphMemAttrReservedMemCurrent) / double(MiB),
              attr(cudaGraphMemAttrUsedMemCurrent) / double(MiB));
}
void reset() {
  CK(cudaDeviceSynchronize());
  CK(cudaDeviceGraphMemTrim(0));
  uint64_t zero = 0;
  CK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrReservedMemHigh, &zero));
  CK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &zero));
}
double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// Launch and wait; returns the host-side time of launch + synchronize, in microseconds.
double launch(cudaGraphExec_t g, cudaStream_t s) {
  const double t0 = now_us();
  cudaError_t e = cudaGraphLaunch(g, s);
  if (e != cudaSuccess) return -double(e);
  CK(cudaStreamSynchronize(s));
  return now_us() - t0;
}

// Captures `body` on s into an executable graph (flags: instantiate flags).
template <class F>
cudaGraphExec_t capture(cudaStream_t s, unsigned long long flags, F body) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  body();
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t x;
  CK(cudaGraphInstantiateWithFlags(&x, g, flags));
  CK(cudaGraphDestroy(g));
  return x;
}

// One graph of one allocation of `bytes`, freed in the graph or not.
cudaGraphExec_t one_alloc(cudaStream_t s, size_t bytes, bool free_it, void** out,
                          unsigned long long flags = cudaGraphInstantiateFlagAutoFreeOnLaunch) {
  return capture(s, flags, [&] {
    CK(cudaMallocAsync(out, bytes, s));
    use(*out, bytes, s);
    if (free_it) CK(cudaFreeAsync(*out, s));
  });
}

void auto_free(cudaStream_t s) {
  const char* sc = "autofree";
  void* p = nullptr;
  cudaGraphExec_t g = one_alloc(s, 64 * MiB, false, &p, 0);
  std::printf("%s first_launch %s\n", sc, launch(g, s) >= 0 ? "ok" : "fail");
  cudaError_t e = cudaGraphLaunch(g, s);
  std::printf("%s relaunch_unfreed %s\n", sc, cudaGetErrorName(e));
  (void)cudaGetLastError();
  CK(cudaStreamSynchronize(s));
  CK(cudaFreeAsync(p, s));
  std::printf("%s relaunch_after_free %s\n", sc, launch(g, s) >= 0 ? "ok" : "fail");
  CK(cudaFreeAsync(p, s));
  CK(cudaGraphExecDestroy(g));
  void* q = nullptr;
  cudaGraphExec_t h = one_alloc(s, 64 * MiB, false, &q);
  launch(h, s);
  std::printf("%s relaunch_unfreed_with_flag %s\n", sc, launch(h, s) >= 0 ? "ok" : "fail");
  mem(sc, "with_flag_two_launches");
  CK(cudaFreeAsync(q, s));
  CK(cudaGraphExecDestroy(h));
  reset();
}

// a (first MiB) freed, then b (second MiB) in one graph: does b get a's address?
void reuse_pair(cudaStream_t s, size_t first, size_t second, bool keep_b) {
  void *a = nullptr, *b = nullptr;
  cudaGraphExec_t g = capture(s, cudaGraphInstantiateFlagAutoFreeOnLaunch, [&] {
    CK(cudaMallocAsync(&a, first, s));
    use(a, first, s);
    CK(cudaFreeAsync(a, s));
    CK(cudaMallocAsync(&b, second, s));
    use(b, second, s);
    if (!keep_b) CK(cudaFreeAsync(b, s));
  });
  launch(g, s);
  std::printf("reuse first_KiB %zu second_KiB %zu keep %d same_address %d offset_KiB %lld\n",
              first >> 10, second >> 10, keep_b, a == b, (long long)((char*)b - (char*)a) / 1024);
  mem("reuse", "after");
  if (keep_b) CK(cudaFreeAsync(b, s));
  CK(cudaGraphExecDestroy(g));
  reset();
}

void layout(cudaStream_t s) {
  std::vector<void*> p(6);
  const size_t kib[6] = {1, 1, 3072, 1, 40960, 1};
  cudaGraphExec_t g = capture(s, cudaGraphInstantiateFlagAutoFreeOnLaunch, [&] {
    for (int i = 0; i < 6; ++i) CK(cudaMallocAsync(&p[i], kib[i] << 10, s));
    for (int i = 0; i < 6; ++i) CK(cudaFreeAsync(p[i], s));
  });
  for (int i = 0; i < 6; ++i)
    std::printf("layout alloc %d KiB %zu offset_KiB %lld\n", i, kib[i],
                (long long)((char*)p[i] - (char*)p[0]) / 1024);
  launch(g, s);
  mem("layout", "after");
  CK(cudaGraphExecDestroy(g));
  reset();
}

// Two graphs of 256 MiB each (freed inside), on one or two streams, with or without ordering.
void two_streams(cudaStream_t s1, cudaStream_t s2, int mode) {
  const char* names[] = {"same_stream",
                         "two_streams_nosync",
                         "two_streams_sync",
                         "two_streams_event",
                         "two_streams_overlap",
                         "two_streams_done_unsynced",
                         "two_streams_event_while_running"};
  void *a = nullptr, *b = nullptr;
  cudaGraphExec_t ga = one_alloc(s1, 256 * MiB, true, &a);
  cudaGraphExec_t gb = one_alloc(s1, 256 * MiB, true, &b);
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaStream_t sb = mode == 0 ? s1 : s2;
  if (mode == 5) {
    // A finished long before B's launch, but the host never synchronized.
    CK(cudaGraphLaunch(ga, s1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CK(cudaGraphLaunch(gb, sb));
    CK(cudaDeviceSynchronize());
  } else if (mode == 6) {
    // A still runs (behind a 20 ms spin) when B, ordered after it by an event, is launched.
    spin<<<1, 1, 0, s1>>>(40000000LL);
    CK(cudaGraphLaunch(ga, s1));
    CK(cudaEventRecord(ev, s1));
    CK(cudaStreamWaitEvent(s2, ev));
    CK(cudaGraphLaunch(gb, sb));
    CK(cudaDeviceSynchronize());
  } else if (mode == 4) {
    // Keep s1 busy so that A is still running when B is launched.
    CK(cudaGraphLaunch(ga, s1));
    CK(cudaGraphLaunch(gb, sb));
    CK(cudaDeviceSynchronize());
  } else {
    launch(ga, s1);
    if (mode == 2) CK(cudaDeviceSynchronize());
    if (mode == 3) {
      CK(cudaEventRecord(ev, s1));
      CK(cudaStreamWaitEvent(s2, ev));
    }
    CK(cudaGraphLaunch(gb, sb));
    CK(cudaDeviceSynchronize());
  }
  mem(names[mode], "after_both");
  // Relaunch both alternately: a steady state.
  for (int i = 0; i < 3; ++i) {
    CK(cudaGraphLaunch(ga, s1));
    CK(cudaGraphLaunch(gb, sb));
  }
  CK(cudaDeviceSynchronize());
  mem(names[mode], "steady");
  CK(cudaEventDestroy(ev));
  CK(cudaGraphExecDestroy(ga));
  CK(cudaGraphExecDestroy(gb));
  reset();
}

// Fork/join capture: branch 1 (s1) and branch 2 (s2) each allocate and free 64 MiB in parallel;
// after the join s1 allocates 64 MiB again.
void fork_join(cudaStream_t s1, cudaStream_t s2) {
  void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  cudaGraphExec_t g = capture(s1, cudaGraphInstantiateFlagAutoFreeOnLaunch, [&] {
    CK(cudaEventRecord(fork, s1));
    CK(cudaStreamWaitEvent(s2, fork));
    CK(cudaMallocAsync(&a, 64 * MiB, s1));
    use(a, 64 * MiB, s1);
    CK(cudaFreeAsync(a, s1));
    CK(cudaMallocAsync(&b, 64 * MiB, s2));
    use(b, 64 * MiB, s2);
    CK(cudaFreeAsync(b, s2));
    CK(cudaMallocAsync(&c, 64 * MiB, s1));  // after a's free on s1, parallel to b
    use(c, 64 * MiB, s1);
    CK(cudaFreeAsync(c, s1));
    CK(cudaEventRecord(join, s2));
    CK(cudaStreamWaitEvent(s1, join));
    CK(cudaMallocAsync(&d, 64 * MiB, s1));  // after both branches
    use(d, 64 * MiB, s1);
    CK(cudaFreeAsync(d, s1));
  });
  launch(g, s1);
  std::printf("fork_join b_eq_a %d c_eq_a %d c_eq_b %d d_eq_a %d d_eq_b %d\n", a == b, c == a,
              c == b, d == a, d == b);
  std::printf("fork_join offsets_KiB b %lld c %lld d %lld\n",
              (long long)((char*)b - (char*)a) / 1024, (long long)((char*)c - (char*)a) / 1024,
              (long long)((char*)d - (char*)a) / 1024);
  mem("fork_join", "after");
  CK(cudaGraphExecDestroy(g));
  CK(cudaEventDestroy(fork));
  CK(cudaEventDestroy(join));
  reset();
}

// G1 frees its 64 MiB inside; G2 keeps a 64 MiB output. Launch G1, G2 (same stream), then G1
// again while G2's output is live: does the relaunch remap?
void remap_held(cudaStream_t s) {
  void *a = nullptr, *b = nullptr;
  cudaGraphExec_t g1 = one_alloc(s, 64 * MiB, true, &a);
  cudaGraphExec_t g2 = one_alloc(s, 64 * MiB, false, &b);
  std::printf("remap_held g1_first_us %.1f\n", launch(g1, s));
  std::printf("remap_held g1_again_us %.1f\n", launch(g1, s));
  std::printf("remap_held g1_again_us %.1f\n", launch(g1, s));
  mem("remap_held", "after_g1");
  std::printf("remap_held g2_first_us %.1f\n", launch(g2, s));
  mem("remap_held", "after_g2");
  std::printf("remap_held g1_with_g2_live_us %.1f\n", launch(g1, s));
  mem("remap_held", "after_g1_again");
  std::printf("remap_held g1_next_us %.1f\n", launch(g1, s));
  CK(cudaFreeAsync(b, s));
  CK(cudaStreamSynchronize(s));
  std::printf("remap_held g1_after_free_us %.1f\n", launch(g1, s));
  mem("remap_held", "end");
  CK(cudaGraphExecDestroy(g1));
  CK(cudaGraphExecDestroy(g2));
  reset();
}

// cudaGraphUpload on s1, then launch on s1 or on s2.
void upload(cudaStream_t s1, cudaStream_t s2) {
  for (int other = 0; other < 2; ++other) {
    void* a = nullptr;
    cudaGraphExec_t g = one_alloc(s1, 256 * MiB, true, &a);
    const double t0 = now_us();
    CK(cudaGraphUpload(g, s1));
    CK(cudaStreamSynchronize(s1));
    const double up = now_us() - t0;
    mem(other ? "upload_other" : "upload_same", "after_upload");
    const double first = launch(g, other ? s2 : s1);
    const double second = launch(g, other ? s2 : s1);
    std::printf("%s upload_us %.1f launch_us %.1f relaunch_us %.1f\n",
                other ? "upload_other" : "upload_same", up, first, second);
    mem(other ? "upload_other" : "upload_same", "after_launch");
    CK(cudaGraphExecDestroy(g));
    reset();
  }
  // Baselines: no upload; launch on s1 then s2.
  void* a = nullptr;
  cudaGraphExec_t g = one_alloc(s1, 256 * MiB, true, &a);
  const double first = launch(g, s1), again = launch(g, s1), moved = launch(g, s2),
               back = launch(g, s1);
  std::printf("no_upload first_us %.1f again_us %.1f other_stream_us %.1f back_us %.1f\n", first,
              again, moved, back);
  CK(cudaGraphExecDestroy(g));
  reset();
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 77;
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  void* warm = nullptr;
  CK(cudaMalloc(&warm, 1));
  auto_free(s1);
  const size_t pairs[][2] = {{64 * MiB, 64 * MiB}, {64 * MiB, 32 * MiB},   {64 * MiB, 96 * MiB},
                             {3072, 2048},         {2048, 3072},           {3 * MiB, 4 * MiB},
                             {4 * MiB, 3 * MiB},   {2 * MiB, 2 * MiB + 1}, {40 * MiB, 8 * MiB}};
  for (auto& pr : pairs) {
    reuse_pair(s1, pr[0], pr[1], false);
    reuse_pair(s1, pr[0], pr[1], true);
  }
  layout(s1);
  for (int mode = 0; mode < 7; ++mode) two_streams(s1, s2, mode);
  fork_join(s1, s2);
  remap_held(s1);
  upload(s1, s2);
  // Host cost of an event record + wait between idle streams, and of an idle device sync.
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  double t0 = now_us();
  for (int i = 0; i < 100; ++i) {
    CK(cudaEventRecord(ev, s1));
    CK(cudaStreamWaitEvent(s2, ev));
  }
  std::printf("costs stream_wait_us %.2f\n", (now_us() - t0) / 100);
  t0 = now_us();
  for (int i = 0; i < 100; ++i) CK(cudaDeviceSynchronize());
  std::printf("costs synchronize_us %.2f\n", (now_us() - t0) / 100);
  return 0;
}
