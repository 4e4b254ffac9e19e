// Tensor-parallel communication on one node: what the collectives of a step cost in time (the GPU
// file's measured tables), and the device memory NCCL and a vLLM-style custom all-reduce hold on
// each rank.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/result.h"
#include "backends/sim/cost_model.h"

namespace memsim {

// How a model is spread over GPUs (vLLM's ParallelConfig), all on one node: tensor x pipeline
// ranks make one engine, data_parallel_size engines (replicas) run side by side.
struct ParallelConfig {
  uint32_t tensor = 1;    // tensor_parallel_size: ranks that shard every layer
  uint32_t pipeline = 1;  // pipeline_parallel_size
  uint32_t data = 1;      // data_parallel_size: engine replicas
  uint32_t gpus() const { return tensor * pipeline * data; }
};

// The communication settings of the engine (vLLM's defaults).
struct CommOptions {
  bool nccl_cumem = false;        // NCCL_CUMEM_ENABLE: vLLM sets 0 (vllm/env_override.py)
  bool custom_all_reduce = true;  // vLLM: not disable_custom_all_reduce
};

// vLLM's CustomAllreduce (vllm/distributed/device_communicators/custom_all_reduce.py): world
// sizes 2, 4, 6 and 8 (_SUPPORTED_WORLD_SIZES; memsim assumes the node's GPUs fully connected by
// NVLink, as the custom all-reduce requires above 2), buffers of max_size 8 MiB.
inline constexpr uint64_t kCustomAllReduceMaxSize = 8ull << 20;
// sizeof(vllm::Signal) (csrc/custom_all_reduce.cuh: start and end flags [36 blocks][8 ranks] and
// _flag[36], uint32 each, 128-byte aligned): ops.meta_size().
inline constexpr uint64_t kCustomAllReduceSignalBytes = 2560;
bool custom_all_reduce_supported(uint32_t world_size);
// What a tensor-parallel step's all-reduces run on: "custom" when custom_all_reduce is on and the
// world size is one the kernel takes (up to 8 MiB; NCCL above), else "nccl" (vLLM falls back to
// NCCL there); "none" on one GPU.
const char* all_reduce_kind(const ParallelConfig& p, const CommOptions& o);
// How many of the GPU file's collective_sizes lie under the custom all-reduce's max_size: the
// length of each custom_all_reduce_us row.
size_t custom_all_reduce_sizes(const InterconnectSpec& ic);

// One rank's communication memory.
struct CommMemory {
  // NCCL: the communicator, and the buffers its first collective sets up (vLLM's
  // PyNcclCommunicator runs a warm-up all-reduce at init), in the environment chosen.
  uint64_t nccl_communicator = 0;
  uint64_t nccl_collectives = 0;
  // Custom all-reduce, when used: the meta buffer (meta_size() + max_size) and the data buffer
  // (max_size), each cudaMalloc'd (granule-rounded) and shared by CUDA IPC; rank_data (8 MiB
  // through PyTorch's caching allocator, which rounds a 1-10 MiB request up to a 20 MiB segment
  // in an allocator holding nothing else). Opening peers' handles (the buffers', and the graph
  // inputs' in register_graph_buffers) takes none of the opener's device memory with NCCL's
  // cuMem off (vLLM), 2 MiB with it on. Measured by memsim's own ranks on H200s: 10 + 8 + 20
  // MiB, + 2 with cuMem (docs/results/tp-memory.md).
  bool custom_all_reduce = false;
  uint64_t custom_meta = 0;
  uint64_t custom_buffer = 0;
  uint64_t custom_rank_data = 0;
  uint64_t custom_ipc = 0;

  // Pipeline parallelism: the PP group's communicator (vLLM gives each rank a PyNcclCommunicator
  // for its pipeline group too, warmed up by an all-reduce, then used to send the intermediate
  // tensors between stages): the GPU file's communicator + collectives + point_to_point (the
  // buffers of the first send/recv), measured on a 2-rank communicator; pp_note says so.
  uint64_t pp_nccl = 0;
  std::string pp_note;

  // The tensor-parallel NCCL memory rank by rank (communicator + first collective), where the GPU
  // file measured it at this rank count (nccl_memory_by_rank); empty: every rank alike, the
  // communicator + collectives above. NCCL's channels and buffers differ by rank at 4 ranks.
  std::vector<uint64_t> nccl_by_rank;

  // Empty, or why the NCCL figures are not measured ones for this rank count.
  std::string nccl_note;

  // NCCL on TP rank `r` (its PP group's included).
  uint64_t nccl_of(uint32_t r) const {
    const uint64_t tp = nccl_by_rank.empty() ? nccl_communicator + nccl_collectives
                                             : nccl_by_rank.at(r % nccl_by_rank.size());
    return tp + pp_nccl;
  }
  // The largest rank's NCCL: what decides whether every rank can start, and the figure a table
  // of one rank gives.
  uint64_t nccl() const {
    uint64_t most = nccl_of(0);
    for (uint32_t r = 1; r < nccl_by_rank.size(); ++r) most = std::max(most, nccl_of(r));
    return most;
  }
  uint64_t custom() const { return custom_meta + custom_buffer + custom_rank_data + custom_ipc; }
  uint64_t total() const { return nccl() + custom(); }
  uint64_t total_of(uint32_t r) const { return nccl_of(r) + custom(); }
};

// Zero for one GPU. Errors (kInvalidArgument): the engine's ranks (tensor x pipeline x data)
// beyond the node, or a GPU file without an interconnect section.
Result<CommMemory> comm_memory(const GpuSpec& gpu, const ParallelConfig& p, const CommOptions& o);

// Collective times on `ranks` GPUs of one node, from the GPU file's tables: log-log linear
// interpolation between measured sizes, the smallest size's time below it, the last two sizes'
// slope (bandwidth) above the largest. For a rank count not measured, the table of the nearest
// measured count is used with the bytes each rank moves scaled: all-reduce (ring) 2 (n - 1) / n,
// all-gather (n - 1); source() says so.
//
// With `custom_all_reduce` (vLLM's CustomAllreduce, at 2, 4, 6 or 8 ranks) an all-reduce of a
// 16-byte multiple under 8 MiB takes the GPU file's custom_all_reduce_us time instead (the
// nearest measured rank count's, unscaled: its one-stage kernel reads every peer's whole input);
// a GPU file without that table keeps NCCL's times, and source() says so.
class CollectiveTime {
 public:
  static Result<CollectiveTime> make(const GpuSpec& gpu, uint32_t ranks,
                                     bool custom_all_reduce = false);

  SimTime all_reduce(uint64_t bytes) const;       // an all-reduce of a `bytes` buffer
  SimTime all_gather(uint64_t part_bytes) const;  // each rank contributes part_bytes
  // A send/recv of `bytes` between two GPUs: the GPU file's send_recv_us, or, where it has none,
  // a 2-rank all-gather of `bytes` parts (the same bytes cross the link each way).
  SimTime send_recv(uint64_t bytes) const;
  bool send_recv_measured() const { return !send_us_.empty(); }
  uint32_t ranks() const { return ranks_; }
  // "measured at 2 ranks (NCCL 2.28.9, h200)" or "... scaled from 4 measured ranks ...".
  const std::string& source() const { return source_; }

 private:
  CollectiveTime() = default;
  uint32_t ranks_ = 1;
  std::vector<double> sizes_;  // bytes
  std::vector<double> reduce_us_, gather_us_;
  double reduce_scale_ = 1, gather_scale_ = 1;    // bytes multiplier for an unmeasured count
  std::vector<double> custom_sizes_, custom_us_;  // empty: every all-reduce over NCCL
  std::vector<double> send_us_;                   // at sizes_; empty: not measured
  std::string source_;
};

}  // namespace memsim
