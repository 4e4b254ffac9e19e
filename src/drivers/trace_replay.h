// Replays an AllocTrace through a caching allocator on a backend: the allocator's reserved and
// allocated bytes after every op, its peaks, and the smallest capacity it fits in.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/sim/cost_model.h"
#include "src/alloc/caching_allocator.h"
#include "src/alloc/registry.h"
#include "workload/alloc_trace.h"

namespace memsim {

struct ReplaySample {
  uint32_t op = 0;
  int64_t time_us = 0;
  uint64_t allocated = 0;  // bytes of live blocks (after rounding)
  uint64_t requested = 0;  // bytes callers asked for, of live blocks
  uint64_t reserved = 0;   // bytes the allocator holds from the device
};

struct ReplayOutcome {
  bool oom = false;        // a malloc ran out of memory; the replay stopped there
  uint32_t failed_op = 0;  // with oom or error: the op that failed
  std::string error;       // why it stopped (out of memory, or a misbehaving allocator)
  uint32_t ops_done = 0;
  AllocatorStats stats;  // at the end (before teardown)
  uint64_t peak_reserved = 0;
  uint64_t peak_allocated = 0;
  uint64_t peak_requested = 0;       // of the bytes callers asked for: the program's demand
  uint64_t allocated_at_peak = 0;    // allocated bytes when reserved first reached its peak
  uint64_t device_alloc_calls = 0;   // device_malloc + create_physical calls of the backend
  int64_t backend_ns = 0;            // simulated (or measured) time in backend calls
  std::vector<ReplaySample> series;  // one per op (when asked for)
  // With a recorded trace: the first op after which reserved bytes differ from the recording.
  std::optional<uint32_t> first_mismatch;

  // 1 - allocated / reserved at the reserved peak (0 with nothing reserved).
  double fragmentation_at_peak() const {
    return peak_reserved == 0
               ? 0.0
               : 1.0 - static_cast<double>(allocated_at_peak) / static_cast<double>(peak_reserved);
  }
};

struct ReplayOptions {
  bool series = true;             // keep one sample per op
  bool check_invariants = false;  // check the allocator after every op (tests)
  // Called after every op that ran (e.g. to compare with cudaMemGetInfo on a GPU).
  std::function<void(uint32_t op, const AllocatorStats& stats)> after_op;
};

struct SnapshotSettings;
// The torch_caching keys (YAML flow map) that reproduce a snapshot's allocator_settings, e.g.
// "{max_split_size: 41943040, roundup_power2_divisions: {1MiB: 4, ...}}"; "{}" for defaults.
std::string torch_caching_yaml(const SnapshotSettings& s);

// Replays `trace` through `alloc` (fresh, over `backend`): adopts the initial segments, runs the
// ops, and releases everything at the end. An out-of-memory malloc is an outcome, not an error;
// the Result fails only when the trace is invalid.
Result<ReplayOutcome> replay_trace(const AllocTrace& trace, CachingAllocator& alloc,
                                   Backend& backend, const ReplayOptions& options = {});

// The smallest device capacity (a multiple of the backend granularity) on which the replay of
// `trace` through allocators made by `factory` runs without running out of memory, found by
// bisection between `lo` and `hi` (hi must succeed). Each probe replays on a fresh SimBackend
// built from `gpu` with its capacity set.
uint64_t min_capacity(const AllocTrace& trace, const AllocatorFactory& factory, const GpuSpec& gpu,
                      uint64_t lo, uint64_t hi);

}  // namespace memsim
