// The rollout side of the RL timeline, planned before it runs: the engine's KV budget and
// weight tensors, and each iteration's generation simulated by the serving engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/rl/rl_timeline.h"
#include "src/serve/kv_budget.h"

namespace memsim {

struct RolloutIteration {
  SimTime duration = 0;  // first arrival to last completion
  uint64_t preemptions = 0;
  uint64_t output_tokens = 0;
  uint64_t train_tokens = 0;  // prompt + response tokens of every sample (the training batch)
};

struct RolloutPlan {
  std::string error;  // the engine cannot be built (no room for KV) or a serving run failed
  KvBudget budget;
  // vLLM's fused parameters: embedding, per layer qkv_proj (+ bias), o_proj, gate_up_proj,
  // down_proj, two norms (+ q/k norms), final norm, LM head unless tied.
  std::vector<uint64_t> weight_tensors;
  uint64_t kv_layer_bytes = 0;  // the KV cache: one tensor per layer (whole blocks)
  uint64_t mean_sequence_tokens = 0;
  // The teardown baseline: the capture model's time to capture the engine's graphs again (the
  // budget's capture sizes and graph strategy on the sim backend, the pool's allocations
  // included); 0 for other runs and when eager.
  SimTime recapture_time = 0;
  std::vector<RolloutIteration> iterations;
};

// Byte sizes of the rollout engine's weight tensors (sum: ModelShape::weight_bytes()).
std::vector<uint64_t> rollout_weight_tensors(const ModelShape& m);
// The rollout engine settings a run's plan depends on (runs with equal keys share a plan).
std::string rollout_plan_key(const RlConfig& c, const ModelShape& m, const RlRunSpec& run);
// `serve`: simulate each iteration's generation (else durations are 0: memory alone).
RolloutPlan plan_rollout(const RlConfig& c, const ModelShape& m, const RlRunSpec& run,
                         bool serve = true);
// The largest utilization in [0.01, 1] (steps of 0.01) at which `run` completes every iteration
// without running out of memory; 0 when none does.
double max_rollout_utilization(const RlConfig& c, const ModelShape& m, const RlRunSpec& run);
// Whether the run's rollout is sized by SGLang's mem_fraction_static (then
// max_rollout_utilization searches that fraction) rather than vLLM's gpu_memory_utilization.
bool rollout_uses_sglang_rule(const RlConfig& c, const RlRunSpec& run);
RlRunResult run_rl_with_plan(const RlConfig& c, const ModelShape& m, const RlRunSpec& run,
                             const RolloutPlan& plan, const RlRunHooks& hooks = {});

}  // namespace memsim
