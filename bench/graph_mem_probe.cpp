// memsim-graphmem-probe: how the CUDA driver backs graph memory nodes. Captures small alloc/free
// scenarios into one graph, launches it, and prints the driver's reserved graph memory next to
// memsim's model (the shadow). Exits 77 without a GPU.
#include <fmt/format.h>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "bench/bench_cli.h"

using namespace memsim;

namespace {

const std::string kUsage =
    "usage: memsim-graphmem-probe\n"
    "  Captures small alloc/free scenarios into CUDA graphs and prints the driver's reserved\n"
    "  graph memory next to memsim's model. Exits 77 without a GPU.\n";

int run(int argc, char**) {
  if (argc > 1) throw bench::UsageError("takes no arguments");
  // Ops: "aN" allocates N KiB (the i-th allocation), "fI" frees allocation I, inside one graph.
  const std::vector<std::string> scenarios = {
      "a102400 f0 a204800",                    // a freed 100 MiB, then 200 MiB
      "a102400 a102400 f0 f1 a204800",         // two adjacent freed 100 MiB, then 200 MiB
      "a204800 f0 a102400 a102400",            // a freed 200 MiB, then two 100 MiB
      "a102400 f0 a102400",                    // same size again
      "a1 a1 a1 a1 a1 a1 a1 a1 a1 a1",         // ten 1 KiB allocations live at once
      "a3072",                                 // 3 MiB
      "a3072 a3072 a3072",                     // three 3 MiB
      "a128256 a256512 f0 a256512 f1 a1 f2",   // a sampler tail: bf16, fp32, probs, ids
      "a65536 f0 a32768 a32768 f1 f2 a65536",  // 64 MiB freed, split in two, merged back
  };
  SimClock clock;
  GpuSpec spec = unpriced_gpu_spec("graphmem-probe");
  spec.graph_mem_chunk = 32ull << 20;  // the model's arena chunk, as in configs/gpus/h200.yaml
  auto made = CudaBackend::create(spec, clock, nullptr);
  if (!made.ok()) {
    std::fprintf(stderr, "graphmem probe: %s\n", made.error().message.c_str());
    return made.error().code == ErrorCode::kNotSupported ? 77 : 1;
  }
  CudaBackend& cuda = **made;
  fmt::print("{:<44} {:>14} {:>14} {:>14}\n", "scenario (KiB)", "sum allocs MiB", "driver MiB",
             "memsim MiB");
  for (const std::string& sc : scenarios) {
    std::istringstream in(sc);
    std::string op;
    std::vector<DevPtr> ptrs;
    uint64_t sum = 0;
    const StreamId s{0};
    if (!cuda.begin_capture(s).ok()) return 1;
    while (in >> op) {
      const uint64_t n = std::stoull(op.substr(1));
      if (op[0] == 'a') {
        auto p = cuda.malloc_async(n << 10, s);
        if (!p.ok()) return 1;
        (void)cuda.fill(*p, n << 10, 7, s);
        ptrs.push_back(*p);
        sum += n << 10;
      } else {
        if (!cuda.free_async(ptrs[n], s).ok()) return 1;
        ptrs[n] = 0;
      }
    }
    // Free what is still live inside the graph, so nothing outlives it.
    for (DevPtr p : ptrs)
      if (p) (void)cuda.free_async(p, s);
    auto graph = cuda.end_capture(s);
    if (!graph.ok() || !cuda.launch(*graph, s).ok() || !cuda.synchronize().ok()) return 1;
    const auto o = cuda.observe();
    const uint64_t model = cuda.usage().graph_mem_reserved;
    fmt::print("{:<44} {:>14.1f} {:>14.1f} {:>14.1f}\n", sc, sum / 1048576.0,
               o.ok() ? o->graph_reserved_current / 1048576.0 : -1.0, model / 1048576.0);
    (void)cuda.destroy_graph(*graph);
    (void)cuda.graph_mem_trim();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return memsim::bench::guarded_main("memsim-graphmem-probe", kUsage, argc, argv,
                                     [&] { return run(argc, argv); });
}
