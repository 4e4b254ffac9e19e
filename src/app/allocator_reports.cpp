// Allocator replay runs and their table / JSON / CSV rows.
#include "src/app/allocator_reports.h"

#include <algorithm>
#include <ostream>

#include <fmt/format.h>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "src/app/writers.h"

namespace memsim {

uint64_t recorded_peak(const AllocTrace& t) {
  if (!t.recorded) return 0;
  uint64_t peak = t.recorded_initial_reserved;
  for (uint64_t r : t.recorded_reserved) peak = std::max(peak, r);
  return peak;
}

Result<AllocatorRunRecord> run_allocator(const AllocTrace& trace, const std::string& workload,
                                         const std::string& allocator,
                                         const std::string& config_yaml,
                                         const AllocatorFactory& factory, const GpuSpec& gpu,
                                         bool bisect_capacity) {
  SimClock clock;
  SimBackend backend(gpu, clock);
  auto alloc = factory(backend);
  MEMSIM_ASSIGN_OR_RETURN(ReplayOutcome outcome, replay_trace(trace, *alloc, backend));
  AllocatorRunRecord r{workload,           allocator, config_yaml,
                       std::move(outcome), 0,         recorded_peak(trace)};
  if (bisect_capacity && r.outcome.error.empty())
    r.min_capacity = min_capacity(trace, factory, gpu, r.outcome.peak_allocated,
                                  std::max(r.outcome.peak_reserved, gpu.granularity));
  return r;
}

namespace {

constexpr ColumnDoc kAllocatorColumns[] = {
    {"workload", "the allocation program replayed", -16},
    {"allocator",
     "the allocator and the options given to it; (recorded) is PyTorch's own figure from the "
     "snapshot",
     -18},
    {"peak requested", "peak of the bytes the program asked for, of live blocks: its demand", 15},
    {"peak allocated",
     "peak of the allocator's allocated bytes: live blocks after its rounding (PyTorch's "
     "allocated_bytes.all.peak)",
     15},
    {"peak reserved", "peak bytes of the allocator's live segments: what the device sees", 15},
    {"frag@peak", "1 - allocated / reserved at the first op where reserved reached its peak", 10},
    {"dev allocs", "the backend's device_malloc + create_physical calls", 11},
    {"min capacity",
     "the smallest device capacity (whole 2 MiB granules) the replay fits in; - when not searched",
     13},
    {"notes",
     "against a recording: reserved equal to it after every op, or peak Nx its peak; or why the "
     "replay stopped"},
};

std::string vs_recorded(const AllocatorRunRecord& r) {
  const ReplayOutcome& x = r.outcome;
  if (!x.error.empty())
    return fmt::format("{} at op {}: {}", x.oom ? "OOM" : "FAILED", x.failed_op, x.error);
  if (r.recorded_peak == 0) return "";
  if (!x.first_mismatch) return fmt::format("reserved equal to the recording after every op");
  return fmt::format("peak {:.2f}x the recording's",
                     static_cast<double>(x.peak_reserved) / static_cast<double>(r.recorded_peak));
}

}  // namespace

std::span<const ColumnDoc> allocator_columns() {
  return kAllocatorColumns;
}

std::string format_allocator_table(const std::vector<AllocatorRunRecord>& runs, bool workloads,
                                   bool explain) {
  std::vector<ColumnDoc> cols(std::begin(kAllocatorColumns) + (workloads ? 0 : 1),
                              std::end(kAllocatorColumns));
  // The allocator column: as wide as its longest label (replay variants).
  ColumnDoc& label = cols[workloads ? 1 : 0];
  for (const AllocatorRunRecord& r : runs)
    label.width = std::min(label.width, -static_cast<int>(r.allocator.size()));
  const size_t aw = static_cast<size_t>(-label.width);
  std::string out = header_row(cols);
  std::string last_workload;
  for (const AllocatorRunRecord& r : runs) {
    const std::string wl = workloads ? fmt::format("{:<16} ", r.workload) : "";
    if (r.recorded_peak != 0 && r.workload != last_workload)
      out += fmt::format("{}{:<{}} {:>15} {:>15} {:>15}\n", wl, "(recorded)", aw, "", "",
                         human_bytes(r.recorded_peak));
    last_workload = r.workload;
    const ReplayOutcome& x = r.outcome;
    out += fmt::format("{}{:<{}} {:>15} {:>15} {:>15} {:>9.1f}% {:>11} {:>13}  {}\n", wl,
                       r.allocator, aw, human_bytes(x.peak_requested),
                       human_bytes(x.peak_allocated), human_bytes(x.peak_reserved),
                       100.0 * x.fragmentation_at_peak(), x.device_alloc_calls,
                       r.min_capacity ? human_bytes(r.min_capacity) : "-", vs_recorded(r));
  }
  return out + table_legend(cols, kAllocatorsAnchor, explain);
}

std::string allocator_runs_json(const std::vector<AllocatorRunRecord>& runs) {
  std::string js;
  for (size_t k = 0; k < runs.size(); ++k) {
    const AllocatorRunRecord& r = runs[k];
    const ReplayOutcome& x = r.outcome;
    const bool recorded = r.recorded_peak != 0;
    js += fmt::format(
        "    {{\"workload\": \"{}\", \"allocator\": \"{}\", \"config\": \"{}\", "
        "\"peak_requested_bytes\": {}, \"peak_allocated_bytes\": {}, \"peak_reserved_bytes\": {}, "
        "\"fragmentation_at_peak\": {:.6f}, \"device_alloc_calls\": {}, "
        "\"min_capacity_bytes\": {}, \"oom\": {}, \"error\": \"{}\", \"ops_done\": {}, "
        "\"backend_time_us\": {:.3f}, \"matches_recorded\": {}, \"first_mismatch_op\": {}}}{}\n",
        json_escape(r.workload), json_escape(r.allocator), json_escape(r.config_yaml),
        x.peak_requested, x.peak_allocated, x.peak_reserved, x.fragmentation_at_peak(),
        x.device_alloc_calls, r.min_capacity == 0 ? "null" : std::to_string(r.min_capacity),
        x.oom ? "true" : "false", json_escape(x.error), x.ops_done,
        static_cast<double>(x.backend_ns) / 1e3,
        !recorded ? "null" : (x.error.empty() && !x.first_mismatch ? "true" : "false"),
        x.first_mismatch && recorded ? std::to_string(*x.first_mismatch) : "null",
        k + 1 < runs.size() ? "," : "");
  }
  return js;
}

void write_allocator_timeseries(
    std::ostream& ts, const std::vector<AllocatorRunRecord>& runs,
    const std::vector<std::pair<std::string, const AllocTrace*>>& traces) {
  ts << "workload,allocator,op,time_us,allocated_bytes,requested_bytes,reserved_bytes\n";
  for (const auto& [workload, t] : traces)
    for (size_t k = 0; k < t->recorded_reserved.size(); ++k)
      ts << fmt::format("{},recorded,{},{},,,{}\n", workload, k, t->ops[k].time_us,
                        t->recorded_reserved[k]);
  for (const AllocatorRunRecord& r : runs)
    for (const ReplaySample& s : r.outcome.series)
      ts << fmt::format("{},{},{},{},{},{},{}\n", r.workload, csv_cell(r.allocator), s.op,
                        s.time_us, s.allocated, s.requested, s.reserved);
}

}  // namespace memsim
