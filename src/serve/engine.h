// The serving engine: replays requests through a scheduler and a KV-cache strategy on the sim
// backend, charging each step from the roofline model, and reports latency, throughput and
// KV-memory metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/sim/cost_model.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "src/kv/registry.h"
#include "src/serve/latency_samples.h"
#include "src/serve/serve_state.h"
#include "src/serve/step_executor.h"
#include "workload/model_shape.h"
#include "workload/pipeline_time.h"
#include "workload/request_table.h"
#include "workload/requests.h"
#include "workload/step_profile.h"

namespace memsim {

// Where a run stands, for a progress display (the engine itself prints nothing).
struct EngineProgress {
  uint64_t finished = 0;  // requests finished (completed, truncated or rejected)
  uint64_t requests = 0;  // requests of the run
  SimTime simulated = 0;  // simulated time since the run started
};

struct EngineConfig {
  std::string label;
  ModelShape model;
  GpuSpec gpu;
  std::string scheduler = "continuous_batching";
  ServeOptions serve;
  std::string kv_impl;   // registry name
  KvFactory kv_factory;  // built from the run's `kv:` map
  uint64_t kv_budget_bytes = 0;
  SimTime sample_interval = 100'000'000;  // gauges are sampled every 100 ms of simulated time
  // Measured step times (null: the roofline of gpu.compute).
  std::shared_ptr<const ProfiledStepTime> step_profile;
  // Tensor parallelism: `model` is one rank's shard and, without a step_profile (a rank's,
  // collectives included), each step adds these collectives to the roofline
  // (workload/step_time.h).
  std::shared_ptr<const CollectiveTime> collectives;
  // Pipeline parallelism (null: one stage): `model` is still the whole model's rank (the step
  // time), `kv_model` the KV pool's stage, and up to stages() steps are in flight, each running
  // the stages in turn (src/serve/engine_batch_queue.cpp).
  std::shared_ptr<const PipelineTime> pipeline;
  std::optional<ModelShape> kv_model;  // the KV pool's layers when not `model`'s
  // vLLM's hybrid KV cache manager (false: --disable-hybrid-kv-cache-manager): the KV pool gets
  // the model's KV cache groups (src/kv/kv_groups.h), which needs a strategy that
  // holds_kv_groups() when a group has a sliding window (else the run fails at start).
  bool hybrid_kv_cache = true;
  // Decode batch sizes captured as CUDA graphs (ascending; empty: every step eager). vLLM pads a
  // decode step of up to the largest size to the next captured size and replays its graph; the
  // step-time profile prices those steps from its graph profile, and an executor on the GPU
  // captures and replays the same sizes.
  std::vector<uint32_t> graph_sizes;
  // Run stretches of pure-decode steps together (same results, fewer KV calls); off = the
  // step-by-step reference path, which tests compare against. An executor needs every step, so
  // it turns this off.
  bool fast_decode = true;
  // Mark each sequence's own tokens (its prompt past any shared prefix, and its outputs) as
  // private content, so the paged pool defers hashing their blocks until a preemption
  // publishes them (same results, far fewer hash-table operations); off = every full block is
  // hashed as it fills, the reference path tests compare against.
  bool defer_private_hashes = true;
  // The backend the KV strategy allocates through (null: a SimBackend of `gpu`); it runs on the
  // engine's clock. The CUDA serving path passes a CudaBackend.
  std::function<Result<std::unique_ptr<Backend>>(const GpuSpec&, SimClock&)> backend;
  // The real work of each step and its validation (null: none, the default simulation).
  ExecutorFactory executor;
  // The executor's measured wall time of each step is its compute time instead of the step-time
  // model (the model-step executor on the GPU): the clock then runs on measured time, with idle
  // gaps between arrivals skipped rather than waited.
  bool measured_clock = false;
  // Fraction of steps validated besides those after a fork, copy-on-write, swap-in, preemption
  // or eviction (seeded from serve.seed; never changes what is simulated).
  double validate_sample = 0.1;
  // Called every 1024 scheduling loops with the run's progress (null: never). It runs on the
  // engine's thread and should return quickly (throttle output by wall time itself).
  std::function<void(const EngineProgress&)> progress;
};

// A step of a measured-clock run: its shape, the step-time model's prediction and the time the
// executor measured.
struct MeasuredStep {
  StepShape shape;
  SimTime predicted = 0, measured = 0;
  // The host's wall clock when the step was issued (seconds since the Unix epoch), to line the
  // steps up with what else was sampled meanwhile (nvidia-smi clocks and power).
  double wall_s = 0;
  double gpu_ms = 0;  // the GPU's share of `measured` (StepExecutor::measured_step_gpu_ms)
};

struct ServingResult {
  std::string label, kv_impl, scheduler;
  std::string error;  // a broken invariant or internal error: the run failed (not an outcome)
  std::string step_time_source;  // StepTimeModel::source(), or "measured" (measured_clock)
  uint64_t requests = 0, finished = 0, truncated = 0, rejected = 0;
  uint64_t length_capped = 0;  // outputs cut at max_model_len (vLLM finish reason "length")
  std::vector<std::string> rejections;  // why the first rejected requests were (up to 100)
  uint64_t steps = 0;
  SimTime sim_time = 0;  // first arrival to last completion
  double wall_seconds = 0;
  uint64_t output_tokens = 0;
  // Tokens the steps computed: prefill chunks, decodes, recomputes after preemption (whole
  // requests, or the fronts free_front released).
  uint64_t computed_tokens = 0;
  double output_tokens_per_s = 0, requests_per_s = 0;
  Percentiles ttft_ms, tpot_ms, e2e_ms;
  uint32_t max_running_seqs = 0;
  double mean_running_seqs = 0;  // time-weighted over steps
  double waste_pct = 0;          // time-weighted (slots allocated - tokens stored) / allocated
  uint64_t peak_used_blocks = 0;
  uint64_t peak_kv_bytes = 0;  // peak bytes of used blocks
  double prefix_hit_rate = 0;  // hit tokens / queried tokens at admission
  // Simulated time of the KV strategy's backend calls (maps, copies, ...): on the critical path
  // (scheduling, completions), in background steps (overlapped with compute), and the part of
  // the background time no step's compute hid (it delayed the next step).
  SimTime kv_critical_time = 0, kv_background_time = 0, kv_stall_time = 0;
  KvStats kv;  // at the end (before shutdown): pool geometry and counters
  uint64_t kv_capacity_tokens = 0;
  ServeCounters counters;
  bool executed = false;                     // an executor ran every step
  ExecutorReport validation;                 // what it did and checked
  std::vector<MeasuredStep> measured_steps;  // measured_clock: every step
  SampleLog samples;                         // packed gauge samples (see SampleLog)
  std::vector<std::string> series;           // sample.series -> name
};

// Runs `requests` (ids in arrival order) through the engine. Each request's state is built when
// it arrives and freed when it finishes; what the run keeps per request is its latencies
// (LatencySamples, 24 bytes).
ServingResult run_serving(const EngineConfig& config, const RequestTable& requests);
ServingResult run_serving(const EngineConfig& config, const std::vector<RequestSpec>& requests);

}  // namespace memsim
