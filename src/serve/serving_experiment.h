// Serving experiments (experiments/kv_*.yaml): requests replayed through KV-cache strategies
// and schedulers on one GPU and model, one run per `runs:` entry, at a vLLM-style KV budget.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/sim/cost_model.h"
#include "src/config/config_keys.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/serve/engine.h"
#include "src/serve/kv_budget.h"
#include "src/serve/scheduler_registry.h"
#include "workload/model_shape.h"
#include "workload/requests.h"

namespace memsim {

// One run: a KV strategy, a scheduler with its options and the budget inputs.
struct ServingRunSpec {
  std::string label;
  std::string kv_impl;
  std::string kv_params;  // "block_size=16 layout=shared" for tables
  KvFactory kv_factory;
  std::string scheduler;
  ServeOptions serve;
  double gpu_memory_utilization = 0.9;
  double mem_fraction_static = 0;  // engine.mem_fraction_static: SGLang's budget rule (> 0)
  bool enforce_eager = false;
  // engine.export_snapshot: the profile run's allocator timeline (the run's caching allocator
  // on the sim backend) written as a PyTorch snapshot, snapshots/<label>_profile_run.pickle.
  bool export_snapshot = false;
  std::string graph_memory = "shared_pool";
  uint64_t kv_budget_override = 0;  // engine.kv_budget: fixed bytes instead of the formula
  uint32_t budget_block_size = 16;  // block-table input of the captured graphs
  size_t requests = 0;              // index into ServingConfig::request_sets
  bool validate_content = false;    // engine.validate_content: the content executor checks tables
  double validate_sample = 0.1;     // engine.validate_sample
  uint32_t gpu_layers = 0;          // engine.gpu_layers: layers run on the GPU (0 = all)
  // engine.gpu_step (--backend cuda): attention (KV writes + attention, content checks) or model
  // (the whole model step, timed: the run's clock is measured time).
  std::string gpu_step = "attention";
  std::string step_time =
      "auto";  // engine.step_time: auto (profile if one exists), roofline, profile
  // engine.kv_cache_dtype: the KV cache's element type (vLLM's --kv-cache-dtype); nullopt is
  // "auto", the model's dtype. Budget, KV strategies and the roofline see its bytes per token.
  std::optional<DType> kv_cache_dtype;
  bool hybrid_kv_cache = true;  // !engine.disable_hybrid_kv_cache_manager
};

// `model` with the run's KV cache element type (engine.kv_cache_dtype).
ModelShape with_kv_cache_dtype(ModelShape model, std::optional<DType> kv);

// The measured profiles of one (gpu, model, KV cache dtype): eager and graphs.
struct StepProfiles {
  std::string path;  // where the eager profile is or would be
  std::string note;  // how it was found (by the GPU's name), or why there is none
  std::shared_ptr<const ProfiledStepTime> eager;  // null: none exists
  std::string graph_path;
  std::shared_ptr<const StepProfile> graphs;  // null: none exists
};

struct ServingConfig {
  std::string source;  // the YAML file
  std::string experiment;
  GpuSpec gpu;
  ModelShape model;
  // parallel: tensor, pipeline and data parallelism. With data_parallel_size > 1 every run is
  // that many engine replicas behind vLLM's load balancer (src/serve/dp_serving.h), each as
  // below. With tensor_parallel_size > 1 every run simulates one rank (ranks alike): rank_model
  // is its shard, the budget is a rank's, and steps are priced by the rank's profiles
  // (<model>.tp<N>.yaml, calibrate --tensor-parallel N: one rank's measured steps, collectives
  // included) or, without one, by the roofline plus `collectives`. With
  // pipeline_parallel_size > 1 the engine's KV blocks are the least over its stages (the budget
  // shown is that stage's), and each step runs through the stages (`pipeline`) with up to that
  // many steps in flight (src/serve/engine_batch_queue.cpp).
  ParallelSettings parallel;
  ModelShape rank_model;  // = model on one GPU
  std::shared_ptr<const CollectiveTime> collectives;
  std::shared_ptr<const PipelineTime> pipeline;  // null: one stage
  SimTime sample_interval = 100'000'000;
  // The measured step profiles of each KV cache dtype, which price the runs of that
  // engine.kv_cache_dtype: nullopt is the model's dtype (calibrate: <model>[.tpN].yaml), kFP8
  // and kFP8E5M2 the fp8 caches' (calibrate --kv-cache-dtype: <model>.fp8[_e5m2].yaml). Each
  // holds the eager profile and the one of decode steps replayed as CUDA graphs (calibrate
  // --graphs: the decode steps of runs that capture graphs). All three keys are present.
  std::map<std::optional<DType>, StepProfiles> profiles;
  // step_profile_scale: {decode, prefill}: both profiles' decode rows and the eager profile's
  // prefill rows multiplied by these (another machine's speed against the profiled one, as the
  // --backend cuda speed probe measures it); 1 = the profile as measured.
  double profile_decode_scale = 1, profile_prefill_scale = 1;
  std::vector<RequestSet> request_sets;  // one per distinct `requests:` block
  std::vector<ServingRunSpec> runs;
};

struct ServingRunResult {
  ServingRunSpec spec;
  KvBudget budget;           // one rank's (under DP: of each replica, all alike)
  std::string budget_error;  // the budget has no room for KV (an outcome)
  ServingResult result;      // under data parallelism: the replicas merged (run_serving_dp)
  std::vector<ServingResult> replicas;  // data_parallel_size > 1: each engine's own run
  std::vector<uint64_t> assigned;       // requests the load balancer sent to each replica
};

struct ServingResults {
  std::vector<ServingRunResult> runs;
  double wall_seconds = 0;
  bool process_per_run = false;  // each run ran in a process of its own (--process-per-run)
};

// How runs execute beyond the simulation (the CUDA serving path sets both): `customize` edits
// each run's engine (backend, step executor) before it runs; `serial` runs one at a time.
struct ServingRunHooks {
  std::function<void(const ServingRunSpec&, EngineConfig&)> customize;
  bool serial = false;
  // Progress of run `run` (index into config.runs): every 1024 scheduling loops of its engine
  // (EngineConfig::progress), and once when it ends (finished == requests). Runs may call it
  // from several threads at once. Null: none.
  std::function<void(size_t run, const EngineProgress&)> progress;
  // Called with a run's error as soon as it fails (out of host memory included), before the next
  // run starts. A tensor-parallel rank process ends itself there: its peers, waiting in a
  // collective, are then stopped by their launcher instead of meeting the next run's. Null: none.
  std::function<void(const ServingRunSpec&, const std::string& error)> failed;
  // Runs run `run` (its index into config.runs) elsewhere, e.g. in a process of its own, and
  // fills the run's result, replicas and assigned (an error in result.error). Set, no engine
  // runs here and `customize` is not called; the run's budget is still computed here.
  std::function<void(size_t run, ServingRunResult& o)> run_elsewhere;
};

// A `kv:` map ({impl, ...the strategy's keys}) and a `scheduler:` map, parsed and validated
// (shared with the RL experiment). ConfigError names the key.
struct KvChoice {
  std::string impl, params;
  KvFactory factory;
  uint32_t block_size = 16;  // tokens per block (16 for strategies without blocks)
};
KvChoice parse_kv(const ConfigNode& node);
struct SchedulerChoice {
  const SchedulerEntry* info = nullptr;
  ServeOptions options;
};
SchedulerChoice parse_scheduler(const ConfigNode& node, SchedulerChoice base);
// The `scheduler.async_scheduling` key that set a run's option: the run's own (`run`, its
// `runs[]` entry), else the top level's; the run (or root) when neither has it.
ConfigNode async_scheduling_key(const ConfigNode& root, std::optional<ConfigNode> run);

// The maps of a serving config and the keys each accepts (docs/config.md lists them); the
// `kv:` and `scheduler:` maps' entries are parse_kv's and parse_scheduler's.
const ConfigKeys& serving_config_keys();

// Throws ConfigError (file:line: key: message) for any bad input; `overrides` are --set
// assignments applied before validation.
bool is_serving_config(const std::string& path);
bool is_serving_config(const ConfigNode& root);
ServingConfig load_serving_config(const std::string& path,
                                  const std::vector<std::string>& overrides);
// The same from a loaded tree whose overrides are applied (paths resolve from its base_dir()).
ServingConfig load_serving_config(const ConfigNode& root);
// The config with its profiles scaled by `decode` and `prefill` (on top of any scale it has);
// without a profile it is returned unchanged. Throws std::invalid_argument unless both factors
// are positive and finite.
ServingConfig with_profile_scale(ServingConfig c, double decode, double prefill);

// The profiles that price a run whose engine.kv_cache_dtype is `kv_cache_dtype` (nullopt: the
// model's dtype): its entry of c.profiles (empty when there is none).
StepProfiles profiles_for(const ServingConfig& c, std::optional<DType> kv_cache_dtype);
// Whether any dtype has a measured profile (eager or graphs).
bool any_step_profile(const ServingConfig& c);

// Runs every run of the config (in parallel unless hooks.serial). A run that exhausts host
// memory throws HostMemoryError (core/host_memory.h) once all runs have ended.
ServingResults run_serving_experiment(const ServingConfig& config,
                                      const ServingRunHooks& hooks = {});

// The figures a prediction is compared on against a measured run, in report order.
struct ServingMetric {
  const char* name;
  double (*of)(const ServingResult&);
};
inline constexpr ServingMetric kServingMetrics[] = {
    {"tok/s", [](const ServingResult& r) { return r.output_tokens_per_s; }},
    {"TTFT p50", [](const ServingResult& r) { return r.ttft_ms.p50; }},
    {"TTFT p99", [](const ServingResult& r) { return r.ttft_ms.p99; }},
    {"TPOT p50", [](const ServingResult& r) { return r.tpot_ms.p50; }},
    {"TPOT p99", [](const ServingResult& r) { return r.tpot_ms.p99; }},
    {"E2E p50", [](const ServingResult& r) { return r.e2e_ms.p50; }},
    {"E2E p99", [](const ServingResult& r) { return r.e2e_ms.p99; }},
};
inline constexpr size_t kServingMetricCount = std::size(kServingMetrics);

// How far each figure of a profiled prediction moves when every step time moves by about the
// profile's own repeatability: per run and metric (kServingMetrics), the lowest and highest
// value over `base` (the prediction itself) and the experiment run again with its profiles
// scaled by 1 + k * rel / steps, k = -steps..steps. A figure with a wide band, such as a light
// load's median TPOT (whether a request's few decode steps carry another request's prefill
// turns on where steps fall against arrivals), cannot be predicted closer than its band however
// good the step model is. Runs that failed in any of the experiments get no band (ok false).
// Empty (no runs) when the config has no profile.
struct PredictionBand {
  struct Run {
    bool ok = false;
    std::array<double, kServingMetricCount> lo{}, hi{};
  };
  double rel = 0;
  std::vector<Run> runs;
};
PredictionBand prediction_band(const ServingConfig& config, const ServingResults& base, double rel,
                               int steps);

// Per graph size: whether its decode attention runs every sequence as one CTA row per KV head,
// all in one wave (ProfiledStepTime's rows_at_once), by the kernels' planner for the captured
// launch at graph_context_for(max_model_len): no split, and the batch's rows within the CTA
// slots (gpu.compute.sms x kernels::decode_ctas: decode_ctas_per_sm, 1 at head_dim 256, 2 over
// the model's fp8 KV cache).
std::vector<bool> graph_rows_at_once(const ModelShape& model, const GpuSpec& gpu,
                                     const std::vector<uint32_t>& sizes, uint32_t max_model_len);

}  // namespace memsim
