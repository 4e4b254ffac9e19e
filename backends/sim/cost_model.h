// GPU description and per-primitive cost model of the sim backend (read from configs/gpus/*.yaml).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace memsim {

// Cost of one call: per_call + per_handle x handles touched + per_granule x granules
// + bytes / bandwidth + per_log2_mappings x log2(1 + m / va_mappings_knee), m the VA mappings
// live in the process at the call, + first_after_launch when the call is the first of its
// primitive since the last graph launch. All figures in microseconds (bandwidth in bytes per
// microsecond). Fitted in context (memsim calibrate --in-context); 0 where a term does not show.
//
// The mappings term is the driver's VA state. On H200 (vmm_alias, 2 MiB handles) reserve_virtual
// took 12 us with up to 256 mappings live, 21 us at 1-2K, 34 us at 8K and 41 us at 16K;
// end_capture 550, 710, 960 and 1090 us: flat over the first few hundred mappings, then growing
// like a tree's depth, not like the count; the knee (1,024 on the H200 and the H100) is
// fitted with the terms.
//
// The first-after-launch term: after a graph launch, the first call of each primitive ran 2-3x
// its later calls in every strategy run on the H200 and the H100 (device_malloc 130 against
// 60 us, set_access 75 against 27 us, map 4 against 1.4 us, device_free 200 against 65 us): the
// driver's path for it runs cold after the launch. Calls made while their stream captures (graph
// nodes, priced at end_capture) neither pay it nor warm the path.
struct CostTerm {
  double per_call_us = 0;
  double per_handle_us = 0;
  double per_granule_us = 0;
  double bytes_per_us = 0;           // 0 = no per-byte term
  double per_log2_mappings_us = 0;   // per log2(1 + live VA mappings / va_mappings_knee)
  double first_after_launch_us = 0;  // the first call of this primitive since a graph launch
};

// Which primitives were called since the last graph launch, for the first_after_launch term:
// note() each priced call in order; it says whether the call is the first of its primitive
// since the last launch (a launch itself never is: it starts the next round).
class FirstAfterLaunch {
 public:
  bool note(Primitive p) {
    const uint32_t bit = 1u << static_cast<size_t>(p);
    const bool first = p != Primitive::kLaunch && (warm_ & bit) == 0;
    warm_ = p == Primitive::kLaunch ? 0 : warm_ | bit;
    return first;
  }

 private:
  static_assert(static_cast<size_t>(Primitive::kCount) <= 32);
  uint32_t warm_ = 0;  // bit i: primitive i called since the last launch
};

// Compute side of a GPU, for the roofline step-time model (workload/step_time.h) and KV
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

// The GPUs of one node and what tensor parallelism costs on them (workload/collectives.h):
// NCCL's device memory per rank, measured with and without cuMem, and collective times measured
// inside CUDA graphs at rank counts of the node (tools/collective_bench.py).
struct InterconnectSpec {
  uint32_t gpus_per_node = 0;  // 0: the GPU file has no interconnect section
  std::string nccl_version;    // of the measurements
  // NCCL's memory on each rank, in the three steps it is taken: ncclCommInitRank, the first
  // collective (its buffers, set up lazily), the first send/recv (point-to-point buffers).
  struct NcclMemory {
    uint64_t communicator = 0;
    uint64_t collectives = 0;
    uint64_t point_to_point = 0;
  };
  NcclMemory nccl_cumem;     // NCCL_CUMEM_ENABLE=1 (NCCL's default)
  NcclMemory nccl_no_cumem;  // NCCL_CUMEM_ENABLE=0 (what vLLM sets, env_override.py)
  // The rank count the NCCL figures were measured at; at others they are extrapolated, and
  // outputs say so (memsim's ranks measured other, rank-dependent figures at 4 ranks).
  uint32_t nccl_memory_ranks = 2;
  // NCCL's memory (communicator + first collective) measured rank by rank at other rank counts
  // (nccl_memory_by_rank): per count, one total per rank, in each environment. Empty: none.
  std::map<uint32_t, std::vector<uint64_t>> nccl_by_rank_cumem, nccl_by_rank_no_cumem;
  // Collective times: message sizes (ascending; all-reduce: the buffer, all-gather: one rank's
  // part) and, per measured rank count, microseconds at each size.
  std::vector<uint64_t> collective_sizes;
  std::map<uint32_t, std::vector<double>> all_reduce_us;
  std::map<uint32_t, std::vector<double>> all_gather_us;
  // vLLM-style custom all-reduce (memsim-model-bench --all-reduce-check), per measured rank
  // count: one time for each of the collective_sizes under its max_size (custom_all_reduce_sizes).
  // Empty: not measured on this GPU.
  std::map<uint32_t, std::vector<double>> custom_all_reduce_us;
  // NCCL send/recv between two GPUs (a pipeline stage's intermediate tensors), eager, one time
  // for each of the collective_sizes (tools/collective_bench.py --send-recv-only). Empty: not
  // measured on this GPU.
  std::vector<double> send_recv_us;
};

// Unified memory (Jetson Orin; seed orinmllm-paged-attention.md 8.2, 16.6): CPU and GPU share
// one DRAM. device_malloc (cudaMalloc) over-commits: it reserves address space and commits no
// memory; a page becomes physical the first time a fill or a copy writes it (Linux's
// overcommit), so a memset makes a whole pool resident. Pinned host memory and what the OS and
// CPU side keep (host_reserved) come out of the same capacity.
struct UnifiedMemorySpec {
  bool enabled = false;           // the GPU file has a unified_memory section
  uint64_t first_touch_page = 0;  // bytes made physical per page first written
  uint64_t host_reserved = 0;     // taken by the OS, the CUDA runtime and the CPU side
};

struct GpuSpec {
  std::string name;
  uint64_t capacity = 0;  // device memory in bytes (cudaMemGetInfo's total)
  // Device memory the CUDA context and runtime hold before the process allocates anything
  // (total - free after cudaFree(0); measured by tools/repro/context_memory.cu). It counts
  // against the capacity and never in usage(): an allocation fails when the bytes in use, this
  // included, would exceed the capacity.
  uint64_t context = 0;
  uint64_t granularity = 0;  // VMM allocation granularity
  uint64_t va_space = 0;     // bytes of virtual address space the backend may reserve
  // Live VA mappings at which a per_log2_mappings term reaches one unit (1: log2(1 + mappings)).
  double va_mappings_knee = 1;
  // Extra per-node costs of graphs: a captured node and instantiating one (charged at
  // end_capture), and uploading one at the graph's first launch (memory nodes excepted: their
  // cost is the mapping below). Measured on H200 and H100 (shapes runs, 331-node graphs): a
  // first launch takes 350-450 us, a later one 2-10 us whatever the node count, so a replay has
  // no per-node term.
  double capture_per_node_us = 0;
  double instantiate_per_node_us = 0;
  double upload_per_node_us = 0;
  // Graph memory nodes: mapping physical pages at a graph's first launch (or upload), and
  // remapping them when other graphs' live outputs or concurrent graphs hold them (per granule).
  double graph_mem_map_per_granule_us = 0;
  double graph_mem_remap_per_granule_us = 0;
  uint64_t graph_mem_chunk = 0;  // growth unit of the driver's graph-memory arena (0 = granule)
  std::array<CostTerm, static_cast<size_t>(Primitive::kCount)> costs{};
  ComputeSpec compute;
  InterconnectSpec interconnect;
  UnifiedMemorySpec unified;

  const CostTerm& cost(Primitive p) const { return costs[static_cast<size_t>(p)]; }
  CostTerm& cost(Primitive p) { return costs[static_cast<size_t>(p)]; }
  // Nanoseconds for one call of `p` touching `handles` handles and `bytes` bytes, made while
  // `mappings` VA mappings are live; `first_after_launch`: the first call of `p` since a launch.
  SimTime price(Primitive p, uint64_t handles, uint64_t bytes, uint64_t mappings = 0,
                bool first_after_launch = false) const;
  // The mappings feature: log2(1 + mappings / va_mappings_knee).
  double mappings_feature(uint64_t mappings) const;
  // Microseconds end_capture adds to its cost term for a graph of `nodes` nodes.
  double end_capture_extra_us(uint64_t nodes) const;
  // Microseconds a launch adds to its cost term: nodes uploaded (first launch), graph-memory
  // granules mapped (first launch or upload, or first after a trim) and remapped (others hold
  // the graph's pages).
  double launch_extra_us(uint64_t upload_nodes, uint64_t map_granules,
                         uint64_t remap_granules) const;
};

}  // namespace memsim
