// memsim-alias-bench: cost of vmm_alias's switch to a new virtual space on the real GPU, in
// microseconds per 2 MiB of physical memory mapped into the new space, for several handle sizes
// and access-setting modes (target: <= 1 us per 2 MiB). Exits 77 without a GPU.
#include <fmt/format.h>
#include <chrono>
#include <cstdio>

#include "backends/cuda/cuda_backend.h"
#include "bench/bench_cli.h"
#include "workload/alloc_program.h"
#include "src/alloc/torch_caching.h"
#include "src/config/loaders.h"
#include "src/graph/vmm_alias.h"

using namespace memsim;

namespace {

const std::string kUsage =
    "usage: memsim-alias-bench [PHYSICAL_MIB [SWITCHES]]\n"
    "  Times vmm_alias's switch to a new virtual space over PHYSICAL_MIB MiB of physical memory\n"
    "  (default 4096), SWITCHES times per handle size (default 8). Exits 77 without a GPU.\n";

int run(int argc, char** argv) {
  if (argc > 3) throw bench::UsageError("takes at most two arguments");
  const uint64_t physical =  // MiB -> bytes
      (argc > 1 ? bench::parse_count(argv[1], "PHYSICAL_MIB", 2, 1ull << 30) : 4096) << 20;
  const int switches =
      argc > 2 ? static_cast<int>(bench::parse_count(argv[2], "SWITCHES", 1, 1000000)) : 8;
  SimClock probe_clock;
  auto probe = CudaBackend::create(unpriced_gpu_spec("alias-bench"), probe_clock, nullptr);
  if (!probe.ok()) {
    std::fprintf(stderr, "alias bench: %s\n", probe.error().message.c_str());
    return probe.error().code == ErrorCode::kNotSupported ? 77 : 1;
  }
  probe.value().reset();
  fmt::print("vmm_alias switch_to_new_space: {} MiB of physical memory, {} switches each\n",
             physical >> 20, switches);
  fmt::print("{:>12} {:>11} {:>8} {:>12} {:>14} {:>14} {:>12}\n", "handle", "set_access", "handles",
             "switch us", "us per 2 MiB", "map us/call", "access us/call");
  for (uint64_t handle_mib : {2, 8, 32, 64, 128, 512, 1024}) {
    for (bool per_space : {false, true}) {
      SimClock clock;
      auto made = CudaBackend::create(unpriced_gpu_spec("alias-bench"), clock, nullptr);
      if (!made.ok()) return 1;
      CudaBackend& cuda = **made;
      VmmAliasConfig cfg;
      cfg.handle_bytes = handle_mib << 20;
      cfg.va_factor = 2.0 * static_cast<double>(physical) / static_cast<double>(cuda.capacity());
      cfg.set_access_per_space = per_space;
      SharedVmmSpaces spaces(cuda, cfg);
      // First space: create and map the physical memory (not timed).
      if (auto p = spaces.allocate_segment(physical, StreamId{0}); !p.ok()) {
        fmt::print("allocate failed: {}\n", p.error().message);
        return 1;
      }
      const SimTime map0 = cuda.measured_time_in(Primitive::kMap);
      const uint64_t mapn0 = cuda.measured_calls_of(Primitive::kMap);
      const SimTime acc0 = cuda.measured_time_in(Primitive::kSetAccess);
      const uint64_t accn0 = cuda.measured_calls_of(Primitive::kSetAccess);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < switches; ++i) {
        if (auto s = spaces.switch_to_new_space(); !s.ok()) {
          fmt::print("switch failed: {}\n", s.error().message);
          return 1;
        }
      }
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          switches;
      const double per_granule = us / static_cast<double>(physical >> 21);
      const uint64_t mapn = cuda.measured_calls_of(Primitive::kMap) - mapn0;
      const uint64_t accn = cuda.measured_calls_of(Primitive::kSetAccess) - accn0;
      fmt::print(
          "{:>9} MiB {:>11} {:>8} {:>12.1f} {:>14.3f} {:>14.2f} {:>12.2f}\n", handle_mib,
          per_space ? "per_space" : "per_handle", physical / cfg.handle_bytes, us, per_granule,
          mapn ? (cuda.measured_time_in(Primitive::kMap) - map0) / 1000.0 / mapn : 0.0,
          accn ? (cuda.measured_time_in(Primitive::kSetAccess) - acc0) / 1000.0 / accn : 0.0);
      (void)spaces.release_all();
    }
  }
  // The policy the experiment uses: one handle per extension, the extensions being those of
  // a real capture (the Llama-3.1-8B decode program at b=512, as its caching-allocator pool
  // requests segments).
  {
    const ModelShape model =
        load_model_shape(ConfigNode::load_file("configs/models/llama-3.1-8b.yaml"));
    ProgramOptions o;
    o.gemm_workspace_bytes = 0;
    const ShapeProgram prog = make_decode_program(model, 512, o);
    SimClock clock;
    auto made = CudaBackend::create(unpriced_gpu_spec("alias-bench"), clock, nullptr);
    if (!made.ok()) return 1;
    CudaBackend& cuda = **made;
    VmmAliasConfig cfg;
    cfg.handle_per_extension = true;
    SharedVmmSpaces spaces(cuda, cfg);
    TorchCachingAllocator pool(spaces);
    std::vector<DevPtr> ptr(prog.graphs[0].tensors.size());
    for (const ProgramOp& op : prog.graphs[0].ops) {
      if (op.kind == ProgramOp::Kind::kAlloc)
        ptr[op.tensor] = *pool.malloc(prog.graphs[0].tensors[op.tensor].bytes, StreamId{0});
      else
        (void)pool.free(ptr[op.tensor]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < switches; ++i) (void)spaces.switch_to_new_space();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        switches;
    fmt::print("{:>12} {:>11} {:>8} {:>12.1f} {:>14.3f}   (Llama-3.1-8B b=512: {} MiB)\n",
               "per_ext", "per_handle", spaces.handles(), us,
               us / static_cast<double>(spaces.physical_bytes() >> 21),
               spaces.physical_bytes() >> 20);
    (void)pool.release_all();
    (void)spaces.release_all();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return memsim::bench::guarded_main("memsim-alias-bench", kUsage, argc, argv,
                                     [&] { return run(argc, argv); });
}
