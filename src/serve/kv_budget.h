// KV-cache memory budget, sized the way vLLM sizes it: utilization x capacity minus weights, the
// profile run's activation peak and CUDA-graph memory, each simulated on a fresh SimBackend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/result.h"
#include "backends/sim/cost_model.h"
#include "src/drivers/capture_runner.h"
#include "src/graph/registry.h"
#include "src/kv/kv_groups.h"
#include "workload/collectives.h"
#include "workload/model_shape.h"
#include "workload/pipeline_parallel.h"

namespace memsim {

// The engine settings that size the KV pool.
//
//   kv_bytes = floor(gpu_memory_utilization x capacity) - weights - activation_peak - graph_memory
//
// - weights: ModelShape::weight_bytes().
// - activation_peak: vLLM's profile run (gpu_worker determine_available_memory) takes the torch
//   allocator's "allocated_bytes.all.peak" over a dummy forward of max_num_batched_tokens tokens
//   followed by a sampler run on min(max_num_seqs, max_num_batched_tokens) rows (logits only at
//   each request's last position). Modelled by replaying the decode allocation program
//   (workload/decode_program.cpp, full-graph mode, runner inputs and GEMM workspace
//   included) at max_num_batched_tokens rows up to the lm_head, then the program's head (logits,
//   fp32 logits, probs, sampled ids) at the sampler's row count, through the PyTorch-faithful
//   caching allocator on a device holding capacity - weights. The peak allocated bytes are
//   subtracted (vLLM's figure); the peak reserved bytes (allocated + cached segments) are
//   reported beside them.
// - graph_memory: the capture runner with `graph_strategy` over the capture sizes (vLLM's
//   default list, see capture_sizes), on a device holding capacity - weights; the peak physical
//   bytes the strategy holds (graph pools / graph memory nodes). The runner's inputs and GEMM
//   workspace live in the default pool and are counted in activation_peak. 0 when
//   enforce_eager. (vLLM itself measures this with profile_cudagraph_memory() and subtracts it
//   only under VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1; otherwise graphs come out of the
//   1 - utilization margin. memsim always subtracts it.)
//
// Tensor parallelism (parallel.tensor > 1): every term is one rank's. The weights, the profile
// run and the captures are of the rank's shard (workload/tensor_parallel.h) with the collectives'
// outputs in the programs (decode_program.cpp); the KV bytes per token are the rank's KV heads.
// NCCL's and the custom all-reduce's memory (workload/collectives.h) is taken at distributed
// init, before vLLM's memory snapshot (gpu_worker init_device), so it is not subtracted: it comes
// out of the 1 - utilization margin, and vLLM refuses to start when the free memory then is
// below utilization x capacity ("Free memory on device ... on startup is less than desired GPU
// memory utilization"), as memsim does. Ranks under TP alone are symmetric (the vocabulary is
// padded to split evenly), so one rank is computed and stands for all; the engine's KV budget is
// the minimum over ranks (vLLM's get_kv_cache_configs), which is this rank's.
//
// Pipeline parallelism (parallel.pipeline > 1): compute_kv_budget is one rank of stage
// `pipeline_stage` (workload/pipeline_parallel.h: vLLM's layer split, the embedding on the first
// stage, the final norm, LM head and sampler on the last). Its weights are the stage's; its
// profile run is the stage's layers at max_num_batched_tokens, with the persistent intermediate
// tensors (hidden_states + residual) on a stage other than the first, and no logits or sampler
// on a stage other than the last (vLLM's profile_run samples on the last rank only); its
// captures are the stage's programs; its KV bytes per token are its layers'. NCCL's memory
// gains the pipeline group's communicator (CommMemory::pp_nccl: the GPU file's measured 2-rank
// communicator, first all-reduce and first send/recv).
// Stages differ, so compute_engine_kv_budget computes each distinct stage and takes vLLM's
// engine-wide block count: get_kv_cache_configs sizes every worker's blocks from its own memory
// and layers, then gives every worker the smallest count.
struct KvBudgetInput {
  bool export_profile_snapshot = false;  // record the profile run as a PyTorch snapshot
  ModelShape model;
  GpuSpec gpu;
  double gpu_memory_utilization = 0.9;  // (0, 1]
  // > 0: SGLang's rule instead (ModelRunner._profile_available_bytes): the KV pool is what is
  // left of mem_fraction_static x the memory free before the weights load (after NCCL's) once
  // the weights are in; activations and graphs live in the rest, not subtracted.
  double mem_fraction_static = 0;
  uint32_t max_num_batched_tokens = 8192;  // the profile run's token count (vLLM profile_run)
  uint32_t max_num_seqs = 256;
  bool enforce_eager = false;  // no CUDA graphs: graph memory 0
  // A graph-memory registry name (src/graph/registry.h), built with its default parameters
  // unless graph_factory is set (e.g. parsed from YAML with parameters).
  std::string graph_strategy = "shared_pool";
  GraphStrategyFactory graph_factory;
  // The graph shapes. Empty: vLLM's default (vllm/config/vllm.py _set_cudagraph_sizes):
  // [1, 2, 4] + multiples of 8 up to 256 + multiples of 16 above, capped at
  // min(max_num_seqs x 2, 512, max_num_batched_tokens). Sizes above max_num_batched_tokens are
  // dropped, as vLLM drops them from an explicit list.
  std::vector<uint32_t> capture_sizes;
  // vLLM's capture: largest shapes first ("so that the smaller shapes can reuse the memory pool
  // allocated for the large shapes", gpu_model_runner capture_model), weak references to outputs,
  // persistent input buffers, one full-model graph per shape.
  CaptureOrder capture_order = CaptureOrder::kLargeFirst;
  OutputLifetime outputs = OutputLifetime::kWeak;
  GraphRunners graphs = GraphRunners::kFull;
  uint64_t gemm_workspace_bytes = 32ull << 20;  // cuBLAS workspace (PyTorch's size on Hopper)
  uint32_t max_model_len = 8192;                // sizes the block-table input
  uint32_t kv_block_size = 16;                  // tokens per KV block
  // vLLM's hybrid KV cache manager (false: --disable-hybrid-kv-cache-manager): a model with
  // sliding-window layers gets KV cache groups (src/kv/kv_groups.h).
  bool hybrid_kv_cache = true;
  ParallelConfig parallel;      // tensor > 1: `model` is the whole model, sharded here
  uint32_t pipeline_stage = 0;  // the stage compute_kv_budget sizes (< parallel.pipeline)
  CommOptions comm;
};

struct KvBudget {
  std::string profile_snapshot;  // the profile run's timeline (pickle), when asked for
  uint64_t capacity = 0;         // device memory
  uint64_t context = 0;          // held by the CUDA context before the engine starts (GpuSpec)
  uint64_t usable = 0;           // floor(gpu_memory_utilization x capacity)
  uint64_t weights = 0;
  uint64_t activation_peak = 0;           // profile run: peak allocated bytes (subtracted)
  uint64_t activation_reserved_peak = 0;  // profile run: peak reserved bytes (not subtracted)
  uint64_t graph_memory = 0;
  uint64_t kv_bytes = 0;  // usable - weights - activation_peak - graph_memory
  uint64_t kv_bytes_per_token = 0;
  uint64_t kv_tokens = 0;  // kv_bytes / kv_bytes_per_token
  uint64_t kv_blocks = 0;  // kv_bytes / kv_block_bytes
  // The KV cache groups (one full group of every layer without sliding windows), the layers a
  // block holds (the most of any group) and its bytes: kv_block_size x kv_bytes_per_token /
  // layers x kv_group_layers. With several groups kv_tokens is vLLM's "GPU KV cache size",
  // kv_blocks / groups x kv_block_size (else kv_bytes / kv_bytes_per_token).
  std::vector<KvCacheGroup> kv_groups;
  uint32_t kv_group_layers = 0;
  uint64_t kv_block_bytes = 0;
  // The most blocks one request can hold (max_blocks_per_request, kv_groups.h): vLLM's
  // "maximum concurrency" is kv_blocks over this.
  uint64_t kv_max_blocks_per_request = 0;
  uint32_t kv_block_size = 0;
  double gpu_memory_utilization = 0;
  double mem_fraction_static = 0;       // > 0: SGLang's rule sized it (usable = that x free)
  std::string graph_strategy;           // "none (enforce_eager)" when eager
  std::vector<uint32_t> capture_sizes;  // captured (empty when eager)
  uint32_t profile_tokens = 0;          // max_num_batched_tokens
  uint32_t sampler_rows = 0;            // min(max_num_seqs, max_num_batched_tokens)
  // Tensor parallelism: the ranks, what each holds for communication, and what is left free
  // (capacity - usable - communication: the margin the utilization leaves, less NCCL's share).
  uint32_t tensor_parallel = 1;
  uint32_t kv_head_replicas = 1;  // ranks holding a copy of each KV head
  uint32_t pipeline_parallel = 1;
  PipelineStage stage;  // the stage's layers, and whether it is the first / last
  CommMemory comm;
  // What is left free on the rank with the most NCCL memory (all ranks alike unless the GPU file
  // measured NCCL rank by rank at this count), and on TP rank r.
  uint64_t free_bytes() const { return capacity - context - usable - comm.total(); }
  uint64_t free_bytes_of(uint32_t r) const {
    return capacity - context - usable - comm.total_of(r);
  }
};

// What the device has free when the engine starts: its capacity less the CUDA context and the
// communication buffers (vLLM's init snapshot; SGLang's total_gpu_memory).
inline uint64_t free_on_startup(const GpuSpec& gpu, const CommMemory& comm) {
  return gpu.capacity - std::min(gpu.capacity, gpu.context + comm.total());
}

// The graph shapes `in` captures (see KvBudgetInput::capture_sizes); empty when enforce_eager.
std::vector<uint32_t> kv_budget_capture_sizes(const KvBudgetInput& in);

// The capture run whose peak is the graph_memory term (one rank's, its TP programs included), so
// that a GPU run can replay exactly the same captures.
Result<CaptureRunConfig> kv_budget_capture_config(const KvBudgetInput& in);

// Errors: kInvalidArgument for bad settings (utilization outside (0, 1], zero token or sequence
// counts, an unknown graph strategy, no capture size left); kOutOfMemory when the weights, the
// profile run or the captures do not fit the device, or when fewer bytes than one KV block
// remain (message and bytes_short give the shortfall against one block) -- vLLM's "No available
// memory for the cache blocks".
Result<KvBudget> compute_kv_budget(const KvBudgetInput& in);

// One engine's ranks under pipeline parallelism (with one stage: the single rank's budget).
struct EngineKvBudget {
  std::vector<KvBudget> stages;  // one per stage, in order (a stage's TP ranks are alike)
  uint64_t kv_blocks_min = 0;    // the engine's blocks: the least of any stage's kv_blocks
  uint32_t min_stage = 0;        // the (first) stage with that least count
  // KV bytes stage s allocates: kv_blocks_min blocks of its own layers (vLLM allocates the
  // engine's count on every worker; what a stage's budget holds beyond it stays unused).
  uint64_t kv_allocated(size_t s) const { return kv_blocks_min * stages[s].kv_block_bytes; }
};

// Every stage of the engine `in` describes (in.pipeline_stage is ignored); each distinct stage
// is simulated once. Errors: compute_kv_budget's, the message naming the stage under PP.
Result<EngineKvBudget> compute_engine_kv_budget(const KvBudgetInput& in);

// A multi-line human-readable breakdown (ends with a newline).
std::string format_kv_budget(const KvBudget& b);

}  // namespace memsim
