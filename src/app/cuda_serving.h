// The step executor of `--backend cuda` serving runs: every engine step's KV writes and attention
// (or, with engine.gpu_step: model, the whole model step) run on the GPU over the KV strategy's
// own tables, swaps move real rows through pinned memory, and checked steps compare each
// sequence's attention output bit for bit with the same kernels over K/V regenerated from its
// tokens in a layout of their own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "kernels/attention_types.h"
#include "src/app/output.h"
#include "src/exec/step_profiler.h"
#include "src/serve/serving_experiment.h"
#include "src/serve/step_executor.h"

namespace memsim {

class TpGroup;

struct CudaExecutorConfig {
  kernels::AttentionShape shape;  // the model's attention (one layer); kv_cache: its KV storage
  // An fp8 cache's per-tensor k_scale and v_scale: 1.0, vLLM's default without calibrated
  // scales (--calculate-kv-scales or a checkpoint's). Unused for a cache of the model's dtype.
  kernels::KvScales kv_scales;
  // Each layer's sliding window (ModelShape::layer_windows; 0 = full attention; empty: none).
  // A layer reads its KV cache group's block table (KvLayout::layer_group) with its window.
  std::vector<uint32_t> layer_windows;
  uint32_t layers = 0;      // the model's layers
  uint32_t layers_run = 0;  // layers whose work runs each step (0 = all)
  uint32_t max_tokens = 0;  // tokens one step computes at most (max_num_batched_tokens)
  uint32_t max_seqs = 0;    // sequences one step runs at most
  // engine.gpu_step: model: each step runs the whole model (src/exec/model_step.h) over the
  // strategy's KV pool instead of synthesized K/V and attention, with no content checks; the
  // executor times it (host wall clock) for the engine's measured clock.
  bool model_step = false;
  ModelShape model;
  // With model_step over a paged layout: decode batch sizes captured as CUDA graphs (the
  // engine's graph_sizes, up to max_seqs) for contexts up to graph_max_context; decode steps
  // replay the next captured size, padded, as vLLM does. Empty: every step eager.
  std::vector<uint32_t> graph_sizes;
  uint32_t graph_max_context = 0;
  // cudaMemGetInfo's free bytes just before the KV pool was created (set by the backend factory;
  // 0 = unknown): the executor reports the drop the pool caused.
  std::shared_ptr<uint64_t> free_before_pool;
  // Tensor parallelism (model_step): the rank's group. `shape` is then the rank's attention and
  // `model` the whole model, which the step shards; each step's measured time is the largest
  // over the ranks (TpGroup::host_max), so that every rank's engine advances alike.
  TpGroup* tp = nullptr;
  // The backend finishes its own work before returning (CudaBackend's sync_for_timing): a model
  // step then needs no device-wide synchronize before it to see the strategy's copies.
  bool backend_syncs = false;
};

std::unique_ptr<StepExecutor> make_cuda_executor(const CudaExecutorConfig& config);

// `--backend cuda` for the serving experiments: every run allocates its KV pool through a
// CudaBackend and runs each step's KV writes and attention on the GPU (engine.gpu_layers of the
// model's layers, all by default), one run at a time. Fails (kNotSupported) when the model's
// attention has no kernel (head_dim, group) or its dtype is not bf16/fp16.
// With rank >= 0: one rank of config.parallel's tensor parallelism (cuda_modes.h:
// cuda_serving_hooks_for).
Result<ServingRunHooks> cuda_serving_hooks(const ServingConfig& config, int rank = -1,
                                           const std::string& nccl_id = "");

// The sim backend's predictions of the runs timed on the GPU (engine.gpu_step: model).
struct ServingPredictions {
  ServingResults profile;  // the same experiment, step times from the profile as measured
  // With a profile: this GPU's speed against it (probe_profile_speed, isolated grid steps run
  // after the serving runs) and the experiment again with the profile scaled by it, the
  // prediction for this machine (step_profile_scale). Empty when the probe failed (probe_error).
  std::optional<SpeedProbe> probe;
  std::optional<ServingResults> this_gpu;
  std::string probe_error;
  // With a profile: how far each figure moves with every step priced 0.99x to 1.01x.
  std::optional<PredictionBand> band;
};

// Runs the predictions (the probe on the GPU, printing its points to `out`).
ServingPredictions predict_timed_runs(const ServingConfig& config, std::ostream& out);

// Prints per run the strategy bytes, the cudaMemGetInfo drop of the KV pool, the checks passed
// and measured against simulated attention time; writes DIR/validation.csv. With `predicted`,
// runs with engine.gpu_step: model also get measured against predicted throughput, TTFT, TPOT
// and end-to-end latency (DIR/sim_vs_measured.csv), for the profile and for this GPU.
// Returns 0 when every run finished with every check passing, 1 otherwise.
int report_cuda_serving(const ServingConfig& config, const ServingResults& results,
                        const ServingPredictions* predicted, OutputDir& dir, std::ostream& out);

}  // namespace memsim
