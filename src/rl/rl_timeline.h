// The RL co-location timeline: a rollout engine (weights, KV cache, CUDA graphs) and a trainer
// (sharded parameters, gradients, Adam state, activations) sharing one GPU, phase by phase over
// iterations (rollout, pause, scoring, training, weight sync, resume), or on separate GPUs.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/sim/cost_model.h"
#include "core/clock.h"
#include "src/alloc/registry.h"
#include "src/kv/registry.h"
#include "src/saver/registry.h"
#include "src/serve/serve_state.h"
#include "workload/model_shape.h"
#include "workload/requests.h"
#include "workload/train_program.h"

namespace memsim {

// The rollout engine of every run (vLLM / SGLang sized the vLLM way, see kv_budget.h).
struct RlRolloutSpec {
  double gpu_memory_utilization = 0.85;  // of the whole GPU, as veRL passes it to the engine
  // > 0: SGLang's budget rule instead (kv_budget.h): the KV pool is this fraction of the GPU's
  // memory less the rollout's weights, activations and graphs not subtracted.
  double mem_fraction_static = 0;
  ServeOptions serve;
  std::string scheduler = "continuous_batching";
  std::string kv_impl = "paged_block_pool";
  KvFactory kv_factory;
  uint32_t kv_block_size = 16;
  bool enforce_eager = false;
  // Tensor parallelism of the rollout engine (SGLang tp_size / veRL
  // rollout.tensor_model_parallel_size): each GPU holds one rank's shard of the weights and KV
  // heads (workload/tensor_parallel.h), its budget is one rank's (kv_budget.h, NCCL and the
  // custom all-reduce held from init, resident through training), and the serving run is one
  // rank's with the collectives in its step time. The engine spans this many GPUs, so
  // `requests` is then the engine's share (of tensor_parallel GPUs).
  uint32_t tensor_parallel = 1;
  // One GPU's share of an iteration's prompts (arrive together) with n = samples per prompt;
  // iteration i draws with seed + i.
  SyntheticRequestsConfig requests;
};

enum class RlPlacement : uint8_t { kColocated, kSeparate };

// The seed's baseline in place of a saver ("offload weights to CPU after training"): after each
// rollout the engine frees everything it holds (weights, KV cache, graph pool; its caching
// allocator emptied); after training the trainer's gathered weights are copied to pinned host
// memory over PCIe (kDisk: then written to disk at disk_bytes_per_s); before the next rollout
// the engine is rebuilt: weights read back (from disk, then) over PCIe into fresh tensors, the
// KV cache allocated, and the CUDA graphs captured again, at the capture model's time for the
// engine's capture sizes (RolloutPlan::recapture_time). The pinned host copy is allocated once,
// at init, and kept (disk too: it is the staging buffer).
struct RlTeardown {
  enum class WeightsTo : uint8_t { kHost, kDisk };
  WeightsTo weights_to = WeightsTo::kHost;
  double disk_bytes_per_s = 0;  // kDisk: write and read bandwidth
};
const char* to_string(RlTeardown::WeightsTo w);

struct RlRunSpec {
  std::string label;
  RlPlacement placement = RlPlacement::kColocated;
  std::string saver;           // registry name; empty: none (both engines stay resident)
  SaverFactory saver_factory;  // sleep_mode sleeps at its configured level
  // Tags of the rollout engine's memory allocated through the saver (the rest is plain
  // cudaMalloc memory that stays resident): torch_memory_saver wraps weights, KV cache and the
  // graph pool; vLLM's CuMemAllocator only weights and KV cache (level-1 sleep leaves the graph
  // pools resident, vLLM PR 56373).
  std::vector<std::string> saver_tags;
  // Resume in two stages (weights; sync; trainer offloaded; then KV cache and graphs), SGLang's
  // multi-stage awake, or everything at once before the sync.
  bool multi_stage = true;
  // The trainer's parameters (with the reference model) and optimizer state go to pinned host
  // memory between updates (veRL fsdp_config.param_offload / optimizer_offload).
  bool offload_params = true;
  bool offload_optimizer = true;
  double gpu_memory_utilization = 0;   // 0: the rollout's
  double mem_fraction_static = 0;      // > 0: SGLang's rule at this fraction (0: the rollout's)
  std::optional<RlTeardown> teardown;  // the seed's baseline (no saver); co-located only
};

struct RlConfig {
  std::string source;
  std::string experiment = "rl_colocation";
  GpuSpec gpu;
  std::vector<ModelShape> models;
  TrainSpec train;
  bool reference = true;         // a reference policy scores every batch (KL)
  bool old_log_prob = true;      // the actor recomputes log-probabilities before training
  uint32_t optimizer_steps = 1;  // PPO mini-batches per iteration
  RlRolloutSpec rollout;
  uint32_t iterations = 3;
  uint64_t sync_bucket_bytes = 512ull << 20;  // weight-sync buckets
  double interconnect_bytes_per_s = 450e9;    // NVLink per GPU and direction (collectives)
  double network_bytes_per_s = 50e9;          // separate GPUs: weights to the rollout GPUs
  AllocatorFactory allocator;                 // the processes' caching allocator (torch_caching)
  std::string allocator_yaml;
  std::vector<RlRunSpec> runs;
  // Also search, per run, the largest rollout gpu_memory_utilization (in steps of 0.01) at which
  // every iteration completes without running out of memory (memory grows with it: bisection).
  bool max_utilization = true;
};

// What the stacked timeline shows: the rollout engine's and the trainer's memory by purpose,
// and what the caching allocators hold cached beyond their live blocks.
enum class RlTag : uint8_t {
  kWeights,
  kKvCache,
  kCudaGraph,
  kRolloutActivations,
  kRolloutComm,  // the rollout engine's NCCL and custom all-reduce buffers (TP > 1)
  kParams,
  kGrads,
  kOptimizer,
  kActivations,
  kLogits,
  kComm,
  kReference,
  kAllocatorCache,
  kCount
};
inline constexpr size_t kRlTagCount = static_cast<size_t>(RlTag::kCount);
const char* to_string(RlTag t);

struct RlSample {
  SimTime t = 0;
  uint8_t gpu = 0;     // separate placement: 0 = training GPU, 1 = rollout GPU
  uint16_t phase = 0;  // index into RlRunResult::phases
  std::array<uint64_t, kRlTagCount> bytes{};
  uint64_t physical = 0;  // the backend's device bytes (equals the sum of bytes)
};

struct RlPhase {
  uint32_t iteration = 0;
  std::string name;  // rollout, release, score, train, offload, sync, resume
  SimTime start = 0, end = 0;
  uint64_t peak = 0;  // device bytes of the GPU it runs on (separate: see runs_on in the .cpp)
};

// Host wall time of the saver's calls (the driver's on the CUDA backend; next to the simulated
// pause_ms / resume_*_ms), means per iteration.
struct RlMeasured {
  double pause_ms = 0, resume_weights_ms = 0, resume_rest_ms = 0;
};

struct RlRunResult {
  std::string label, model, placement, saver;
  std::string error;  // a failure that is not an outcome (a bug or a bad configuration)
  std::string oom;    // empty: none; else where it ran out of memory and by how much
  uint64_t oom_bytes_short = 0;
  uint32_t iterations_done = 0;
  // The engine's plan: KV budget, the parameters' bytes (ModelShape::weight_bytes), graph pool.
  uint64_t kv_bytes = 0, kv_tokens = 0, weights_bytes = 0, graph_bytes = 0;
  uint32_t rollout_tp = 1;          // the rollout engine's tensor parallelism (figures: one rank)
  uint64_t rollout_comm_bytes = 0;  // its NCCL / custom all-reduce memory per rank
  // What the device holds for them once allocated, as timeseries.csv's rollout.weights,
  // rollout.kv_cache and rollout.cuda_graph show it: through a saver, each tensor is its own
  // physical allocation rounded up to the granularity (2 MiB); through the engine's caching
  // allocator, the tensors' bytes (its rounding counts under allocator_cache). The KV cache is
  // whole blocks of the budget.
  uint64_t weights_reserved_bytes = 0, kv_reserved_bytes = 0, graph_reserved_bytes = 0;
  uint64_t peak = 0;                                  // device bytes, max over phases (and GPUs)
  uint64_t peak_train_gpu = 0, peak_rollout_gpu = 0;  // separate placement
  uint64_t peak_pinned = 0;                           // pinned host bytes
  uint32_t gpus = 1;                                  // per data-parallel rank (separate: 2)
  std::map<std::string, uint64_t> phase_peak;         // max over iterations
  // Seconds per iteration (means over completed iterations).
  double rollout_s = 0, train_s = 0, sync_s = 0, iteration_s = 0;
  double pause_ms = 0;                               // release of the rollout memory (saver pause)
  double resume_weights_ms = 0, resume_rest_ms = 0;  // stage 1 and 2 (all-at-once: stage 1)
  double offload_ms = 0, reload_ms = 0;              // trainer state to and from host
  // The teardown baseline (RlRunSpec::teardown), per iteration: pause_ms is the engine's
  // teardown (frees and empty_cache), resume_weights_ms its weights read back (disk, then
  // PCIe), resume_rest_ms the KV cache allocated and the graphs captured again (recapture_ms of
  // it the capture model's time); weights_out_ms the copy to host (and the disk write) after
  // training, inside the sync. Bytes over PCIe each way (both the engine's weight bytes).
  double weights_out_ms = 0, recapture_ms = 0;
  uint64_t weights_out_bytes = 0, weights_in_bytes = 0;
  // Device bytes each pause gives back (the release phase: the saver's pause and the engine's
  // empty_cache, bytes before minus after) and each resume stage takes again; means over the
  // calls made (pauses, resumes_weights, resumes_rest: 0 when none ran).
  uint64_t pause_freed_bytes = 0, resume_weights_bytes = 0, resume_rest_bytes = 0;
  uint32_t pauses = 0, resumes_weights = 0, resumes_rest = 0;
  // pause_ms and the two resume stages together by primitive (create_physical, map, set_access,
  // unmap, release_physical, host_malloc_pinned, copy over PCIe, ...), ms per iteration.
  std::map<std::string, double> pause_split_ms, resume_split_ms;
  uint64_t preemptions = 0;  // rollout, summed over iterations
  double rollout_tokens_per_s = 0;
  double max_utilization = -1;  // the search's answer; 0: none fits; -1: not searched
  uint64_t graph_launches = 0;  // launches of the captured decode graph after a resume
  bool graphs_valid = true;
  std::string graph_error;
  RlMeasured measured;
  std::vector<RlPhase> phases;
  std::vector<RlSample> samples;
};

struct RlResults {
  std::vector<RlRunResult> runs;  // models x runs, model-major
  double wall_seconds = 0;
};

// How a run executes beyond the simulation (the CUDA path, src/app/rl_cuda.cpp, sets them).
struct RlRunHooks {
  // Makes each GPU's backend on the run's clock (null: a SimBackend of the config's GPU).
  std::function<Result<std::unique_ptr<Backend>>(const GpuSpec&, SimClock&)> backend;
  // At the end of every phase, with the shared GPU's backend and its simulated device bytes.
  std::function<void(Backend&, const RlPhase&, uint64_t physical)> phase_end;
  // After teardown freed everything, with each GPU's backend.
  std::function<void(Backend&)> after_teardown;
};

// Runs every model x run (in parallel). Deterministic for the config.
RlResults run_rl(const RlConfig& config);
RlRunResult run_rl_one(const RlConfig& config, const ModelShape& model, const RlRunSpec& run);

}  // namespace memsim
