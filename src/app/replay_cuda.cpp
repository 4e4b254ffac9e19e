// Allocator replays on the CUDA backend, checked against cudaMemGetInfo.
#include "src/app/replay_cuda.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <ostream>
#include <sstream>

#include <fmt/format.h>

#include "backends/cuda/cuda_backend.h"
#include "core/clock.h"
#include "src/app/writers.h"
#include "src/drivers/trace_replay.h"

namespace memsim {

int replay_on_cuda(const AllocTrace& trace,
                   const std::vector<std::pair<std::string, AllocatorFactory>>& allocators,
                   const GpuSpec& gpu, OutputDir& dir, std::ostream& out, std::ostream& err) {
  std::ostringstream csv;
  csv << "allocator,op,reserved_bytes,device_used_bytes\n";
  out << fmt::format(
      "on the GPU (--backend cuda): device used bytes (cudaMemGetInfo) against "
      "each allocator's reserved bytes after every op\n");
  size_t aw = 18;  // as wide as the longest label (replay variants)
  for (const auto& a : allocators) aw = std::max(aw, a.first.size());
  out << fmt::format("{:<{}} {:>8} {:>8} {:>14} {:>14} {:>10}  {}\n", "allocator", aw, "ops",
                     "equal", "max |delta|", "peak used", "wall ms", "after teardown");
  bool all_ok = true;
  for (const auto& [name, factory] : allocators) {
    SimClock clock;
    auto created = CudaBackend::create(gpu, clock, nullptr);
    if (!created.ok()) {
      err << "memsim replay: --backend cuda: " << created.error().message << "\n";
      return 2;
    }
    CudaBackend& backend = **created;
    auto before = backend.observe();
    if (!before.ok()) {
      err << "memsim replay: cudaMemGetInfo: " << before.error().message << "\n";
      return 1;
    }
    auto alloc = factory(backend);
    uint64_t ops = 0, equal = 0, max_delta = 0, peak_used = 0;
    ReplayOptions opt;
    opt.series = false;
    opt.after_op = [&](uint32_t k, const AllocatorStats& s) {
      auto now = backend.observe();
      if (!now.ok()) return;
      const uint64_t used =
          before->free_bytes >= now->free_bytes ? before->free_bytes - now->free_bytes : 0;
      peak_used = std::max(peak_used, used);
      const uint64_t delta =
          used > s.reserved_bytes ? used - s.reserved_bytes : s.reserved_bytes - used;
      max_delta = std::max(max_delta, delta);
      ++ops;
      equal += delta == 0 ? 1 : 0;
      csv << fmt::format("{},{},{},{}\n", csv_cell(name), k, s.reserved_bytes, used);
    };
    const auto t0 = std::chrono::steady_clock::now();
    Result<ReplayOutcome> r = replay_trace(trace, *alloc, backend, opt);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    alloc.reset();
    auto after = backend.observe();
    const int64_t left = after.ok() ? static_cast<int64_t>(before->free_bytes) -
                                          static_cast<int64_t>(after->free_bytes)
                                    : -1;
    std::string note = left == 0 ? "0 B left" : fmt::format("{} B left", left);
    if (!r.ok())
      note = "replay failed: " + r.error().message;
    else if (!r->error.empty())
      note += "; stopped at op " + std::to_string(r->failed_op) + ": " + r->error;
    all_ok = all_ok && r.ok() && r->error.empty() && equal == ops && left == 0;
    out << fmt::format("{:<{}} {:>8} {:>8} {:>14} {:>14} {:>10.1f}  {}\n", name, aw, ops, equal,
                       human_bytes(max_delta), human_bytes(peak_used), ms, note);
  }
  dir.write("cuda_replay.csv", csv.str());
  out << docs_footer(kCudaTablesAnchor);
  return all_ok ? 0 : 1;
}

}  // namespace memsim
