// The RL co-location timelines on the GPU, checked against cudaMemGetInfo.
#include "src/app/rl_cuda.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <ostream>
#include <sstream>

#include "backends/cuda/cuda_backend.h"
#include "src/app/writers.h"
#include "src/rl/rl_rollout.h"

namespace memsim {

namespace {

std::string outcome(const RlRunResult& r) {
  if (!r.error.empty()) return "error: " + r.error;
  if (!r.oom.empty()) return "OOM at " + r.oom;
  return "ok";
}

// Per primitive over every run: calls, measured and simulated nanoseconds.
struct Totals {
  uint64_t calls = 0;
  SimTime measured = 0, simulated = 0;
};
using PrimitiveTotals = std::array<Totals, static_cast<size_t>(Primitive::kCount)>;

// Prints the per-primitive table; returns its CSV.
std::string print_primitive_totals(const PrimitiveTotals& totals, std::ostream& out) {
  out << "\nper primitive over the runs that finished (host wall time of the real calls, copies "
         "synchronized) against the cost model:\n";
  out << fmt::format("{:<20} {:>9} {:>13} {:>13} {:>7}\n", "primitive", "calls", "measured ms",
                     "simulated ms", "ratio");
  std::ostringstream prim;
  prim << "primitive,calls,measured_ns,simulated_ns\n";
  for (size_t k = 0; k < totals.size(); ++k) {
    const Totals& t = totals[k];
    if (t.calls == 0) continue;
    const char* name = to_string(static_cast<Primitive>(k));
    prim << fmt::format("{},{},{},{}\n", name, t.calls, t.measured, t.simulated);
    out << fmt::format(
        "{:<20} {:>9} {:>13.1f} {:>13.1f} {:>7.2f}\n", name, t.calls,
        static_cast<double>(t.measured) / 1e6, static_cast<double>(t.simulated) / 1e6,
        t.simulated > 0 ? static_cast<double>(t.measured) / static_cast<double>(t.simulated) : 0.0);
  }
  return prim.str();
}

}  // namespace

int run_rl_on_cuda(const RlConfig& c, OutputDir& dir, std::ostream& out, std::ostream& err) {
  // What the process loads on first use must not count as the first checked run's memory (a
  // run that stops at init loads nothing for the next one).
  if (const Status warm = warm_up_cuda_process(0); !warm.ok()) {
    err << "memsim: --backend cuda: warm-up: " << warm.error().message << "\n";
    return 1;
  }
  std::ostringstream csv;
  csv << "model,run,iteration,phase,simulated_bytes,device_used_bytes\n";
  const uint64_t host_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                              static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  out << "\non the GPU (--backend cuda): each co-located run's timeline with real memory; device "
         "used bytes (cudaMemGetInfo) against the simulated bytes at every phase end; the saver's "
         "calls timed (host wall, synchronized) next to the cost model; |delta| may reach the "
         "GPU's page tables for pinned host memory (2 MiB per GiB) + 4 MiB\n";
  out << fmt::format(
      "{:<14} {:<20} {:>7} {:>6} {:>11} {:>10} {:>17} {:>17} {:>17} {:>7} {:>9}  {}\n", "model",
      "run", "phases", "equal", "max |delta|", "pinned", "pause ms meas/sim", "wake1 ms meas/sim",
      "wake2 ms meas/sim", "graphs", "left", "outcome");
  bool all_ok = true;
  PrimitiveTotals totals{};
  for (const ModelShape& m : c.models) {
    for (const RlRunSpec& run : c.runs) {
      auto skip = [&](const std::string& why) {
        out << fmt::format("{:<14} {:<20} skipped: {}\n", m.name, run.label, why);
      };
      if (run.placement == RlPlacement::kSeparate || c.rollout.tensor_parallel > 1) {
        skip(c.rollout.tensor_parallel > 1 ? "a TP rollout needs its ranks' GPUs and NCCL"
                                           : "separate GPUs need two devices");
        continue;
      }
      const RolloutPlan plan = plan_rollout(c, m, run);
      const RlRunResult sim = run_rl_with_plan(c, m, run, plan);
      if (sim.peak_pinned > host_bytes / 2) {
        skip(
            fmt::format("needs {} of pinned host memory, more than half of this machine's {} "
                        "(pinning that much could starve the host)",
                        human_bytes(sim.peak_pinned), human_bytes(host_bytes)));
        continue;
      }
      CudaBackend* cuda = nullptr;
      uint64_t baseline_free = 0, phases = 0, equal = 0, max_delta = 0;
      int64_t left = -1;
      RlRunHooks hooks;
      hooks.backend = [&](const GpuSpec& gpu, SimClock& clock) -> Result<std::unique_ptr<Backend>> {
        auto made = CudaBackend::create(gpu, clock, nullptr, 0, /*sync_for_timing=*/true);
        if (!made.ok()) return made.error();
        auto obs = (*made)->observe();
        if (!obs.ok()) return obs.error();
        baseline_free = obs->free_bytes;
        cuda = made->get();
        return std::unique_ptr<Backend>(std::move(made).value());
      };
      hooks.phase_end = [&](Backend&, const RlPhase& p, uint64_t simulated) {
        auto obs = cuda->observe();
        if (!obs.ok()) return;
        const uint64_t used =
            baseline_free >= obs->free_bytes ? baseline_free - obs->free_bytes : 0;
        const uint64_t delta = used > simulated ? used - simulated : simulated - used;
        ++phases;
        equal += delta == 0 ? 1 : 0;
        max_delta = std::max(max_delta, delta);
        csv << fmt::format("{},{},{},{},{},{}\n", csv_cell(m.name), csv_cell(run.label),
                           p.iteration, p.name, simulated, used);
      };
      hooks.after_teardown = [&](Backend&) {
        auto obs = cuda->observe();
        if (obs.ok())
          left = static_cast<int64_t>(baseline_free) - static_cast<int64_t>(obs->free_bytes);
        for (size_t k = 0; k < totals.size(); ++k) {
          const auto p = static_cast<Primitive>(k);
          totals[k].calls += cuda->measured_calls_of(p);
          totals[k].measured += cuda->measured_time_in(p);
          totals[k].simulated += cuda->time_in(p);
        }
      };
      const RlRunResult r = run_rl_with_plan(c, m, run, plan, hooks);
      const bool same_outcome = r.oom.empty() == sim.oom.empty() && r.error.empty();
      // What the simulation does not hold: the GPU's page tables, 8 bytes per 4 KiB page of
      // pinned host memory mapped for the device (2 MiB per GiB, in 2 MiB chunks) and a chunk
      // for the VMM mappings.
      const uint64_t bound =
          (r.peak_pinned / 512 + (4ull << 20) - 1) / (2ull << 20) * (2ull << 20) + (2ull << 20);
      const bool ok = same_outcome && max_delta <= bound && r.graphs_valid &&
                      (r.oom.empty() ? left == 0 : true);
      all_ok = all_ok && ok;
      out << fmt::format(
          "{:<14} {:<20} {:>7} {:>6} {:>11} {:>10} {:>8.1f}/{:<8.1f} {:>8.1f}/{:<8.1f} "
          "{:>8.1f}/{:<8.1f} {:>7} {:>9}  {}{}\n",
          m.name, run.label, phases, equal, human_bytes(max_delta), human_bytes(r.peak_pinned),
          r.measured.pause_ms, r.pause_ms, r.measured.resume_weights_ms, r.resume_weights_ms,
          r.measured.resume_rest_ms, r.resume_rest_ms,
          r.graph_launches == 0 ? "-" : (r.graphs_valid ? "valid" : "BROKEN"),
          left < 0 ? std::string("-") : human_bytes(static_cast<uint64_t>(left)), outcome(r),
          (same_outcome ? "" : fmt::format(" (simulated: {})", outcome(sim))) +
              (max_delta <= bound ? "" : fmt::format(" (|delta| above {})", human_bytes(bound))));
    }
  }
  dir.write("cuda_rl.csv", csv.str());
  dir.write("cuda_rl_primitives.csv", print_primitive_totals(totals, out));
  out << docs_footer(kCudaTablesAnchor);
  return all_ok ? 0 : 1;
}

}  // namespace memsim
