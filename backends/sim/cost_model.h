// GPU description and per-primitive cost model of the sim backend (read from configs/gpus/*.yaml).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "backends/backend.h"

namespace memsim {

// Cost of one call: per_call + per_handle x handles touched + per_granule x granules
// + bytes / bandwidth. All figures in microseconds (bandwidth in bytes per microsecond).
struct CostTerm {
  double per_call_us = 0;
  double per_handle_us = 0;
  double per_granule_us = 0;
  double bytes_per_us = 0;  // 0 = no per-byte term
};

// Compute side of a GPU, for the roofline step-time model (sim/workload/step_time.h) and KV
// swap transfers. Rates are peak figures; the efficiencies say what fraction a real serving
// step achieves (the defaults the loader documents are estimates, not calibrations).
struct ComputeSpec {
  // Defaults of the optional YAML keys (src/config/loaders.h says why these values).
  static constexpr double kDefaultFlopsEfficiency = 0.6;
  static constexpr double kDefaultBandwidthEfficiency = 0.8;
  static constexpr double kDefaultStepOverheadUs = 50;

  double peak_flops = 0;            // dense fp16/bf16 tensor-core FLOP/s (no sparsity)
  double hbm_bytes_per_s = 0;       // device-memory bandwidth, bytes/s
  double flops_efficiency = 0;      // achieved fraction of peak_flops, (0, 1]
  double bandwidth_efficiency = 0;  // achieved fraction of hbm_bytes_per_s, (0, 1]
  double step_overhead_us = 0;      // fixed per engine step: scheduling, input prep, launch
  double pcie_bytes_per_s = 0;      // achievable host<->device bandwidth (pinned), bytes/s
  // What the attention kernels' planner sees on this GPU (kernels::DeviceLimits; query_device on
  // the device): the decode split plan, and so the split workspace the model executor allocates,
  // depends on them. Defaults: 132 SMs, 2 resident decode CTAs per SM.
  uint32_t sms = 132;
  uint32_t decode_ctas_per_sm = 2;
};

struct GpuSpec {
  std::string name;
  uint64_t capacity = 0;     // device memory in bytes
  uint64_t granularity = 0;  // VMM allocation granularity
  uint64_t va_space = 0;     // bytes of virtual address space the backend may reserve
  // Extra per-node costs of graphs: a captured node, instantiating one node, replaying one.
  double capture_per_node_us = 0;
  double instantiate_per_node_us = 0;
  double replay_per_node_us = 0;
  // Graph memory nodes: mapping physical pages at a graph's first launch, and remapping when a
  // graph moves to another stream (per granule).
  double graph_mem_map_per_granule_us = 0;
  double graph_mem_remap_per_granule_us = 0;
  uint64_t graph_mem_chunk = 0;  // growth unit of the driver's graph-memory arena (0 = granule)
  std::array<CostTerm, static_cast<size_t>(Primitive::kCount)> costs{};
  ComputeSpec compute;

  const CostTerm& cost(Primitive p) const { return costs[static_cast<size_t>(p)]; }
  CostTerm& cost(Primitive p) { return costs[static_cast<size_t>(p)]; }
  // Nanoseconds for one call of `p` touching `handles` handles and `bytes` bytes.
  SimTime price(Primitive p, uint64_t handles, uint64_t bytes) const;
};

}  // namespace memsim
