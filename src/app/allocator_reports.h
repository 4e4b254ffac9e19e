// Replays of allocation traces under caching allocators, and their reports (table rows, the
// summary.json runs list, timeseries.csv), shared by `memsim replay` and the allocators
// experiment.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "backends/sim/cost_model.h"
#include "src/alloc/registry.h"
#include "src/app/legend.h"
#include "src/drivers/trace_replay.h"
#include "workload/alloc_trace.h"

namespace memsim {

struct AllocatorRunRecord {
  std::string workload;     // the trace's label
  std::string allocator;    // the allocator's label
  std::string config_yaml;  // its resolved keys (flow YAML), impl included
  ReplayOutcome outcome;
  uint64_t min_capacity = 0;   // 0: not computed, or the replay failed at full capacity
  uint64_t recorded_peak = 0;  // the trace's own peak reserved (0: not a recording)
};

// Replays `trace` on a SimBackend of `gpu` through a fresh allocator, then (optionally) bisects
// the smallest capacity it fits in. Fails only when the trace is invalid.
Result<AllocatorRunRecord> run_allocator(const AllocTrace& trace, const std::string& workload,
                                         const std::string& allocator,
                                         const std::string& config_yaml,
                                         const AllocatorFactory& factory, const GpuSpec& gpu,
                                         bool bisect_capacity);

// The recorded peak reserved bytes of a trace (0 when it is not a recording).
uint64_t recorded_peak(const AllocTrace& trace);

// Table: one row per run (with a workload column when `workloads` is set); after it, its
// legend with `explain`, else a footer pointing to it.
std::string format_allocator_table(const std::vector<AllocatorRunRecord>& runs, bool workloads,
                                   bool explain = false);
// The allocators table's columns (workload first: only with several workloads), and their
// section of docs/tables.md.
std::span<const ColumnDoc> allocator_columns();
inline constexpr std::string_view kAllocatorsAnchor = "allocators-and-memsim-replay";

// The summary.json "runs" list entries (without brackets), one per line, indented by 4.
std::string allocator_runs_json(const std::vector<AllocatorRunRecord>& runs);

// timeseries.csv: workload,allocator,op,time_us,allocated_bytes,requested_bytes,reserved_bytes;
// a recorded trace adds rows with allocator "recorded" (reserved only).
void write_allocator_timeseries(
    std::ostream& out, const std::vector<AllocatorRunRecord>& runs,
    const std::vector<std::pair<std::string, const AllocTrace*>>& traces);

}  // namespace memsim
