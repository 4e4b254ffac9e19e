// The rollout side of the RL timeline: KV budget, weight tensors and the serving runs.
#include "src/rl/rl_rollout.h"

#include <fmt/format.h>

#include "core/metrics.h"
#include "src/serve/engine.h"
#include "workload/tensor_parallel.h"

namespace memsim {

std::vector<uint64_t> rollout_weight_tensors(const ModelShape& m) {
  const uint64_t d = dtype_bytes(m.dtype);
  const uint64_t q = uint64_t{m.heads} * m.head_dim, kv = uint64_t{m.kv_heads} * m.head_dim;
  std::vector<uint64_t> t;
  t.push_back(m.vocab * m.hidden * d);  // embed_tokens
  for (uint32_t l = 0; l < m.layers; ++l) {
    t.push_back((q + 2 * kv) * m.hidden * d + (m.qkv_bias ? (q + 2 * kv) * d : 0));  // qkv_proj
    t.push_back(q * m.hidden * d);                                                   // o_proj
    t.push_back(2 * m.intermediate * m.hidden * d);                                  // gate_up
    t.push_back(m.intermediate * m.hidden * d);                                      // down_proj
    t.push_back(m.hidden * d);  // input_layernorm
    t.push_back(m.hidden * d);  // post_attention_layernorm
    if (m.qk_norm) {
      t.push_back(m.head_dim * d);  // q_norm
      t.push_back(m.head_dim * d);  // k_norm
    }
  }
  t.push_back(m.hidden * d);                                   // norm
  if (!m.tie_embeddings) t.push_back(m.vocab * m.hidden * d);  // lm_head
  return t;
}

namespace {

// The rollout's budget rule: a run's own setting wins over the rollout's; SGLang's
// mem_fraction_static (> 0) over vLLM's gpu_memory_utilization.
struct BudgetRule {
  bool sglang = false;
  double fraction = 0;
};

BudgetRule budget_rule(const RlConfig& c, const RlRunSpec& run) {
  if (run.mem_fraction_static > 0) return {true, run.mem_fraction_static};
  if (run.gpu_memory_utilization > 0) return {false, run.gpu_memory_utilization};
  if (c.rollout.mem_fraction_static > 0) return {true, c.rollout.mem_fraction_static};
  return {false, c.rollout.gpu_memory_utilization};
}

// The capture model's time for the engine's captures (RolloutPlan::recapture_time): the same
// run the budget's graph-memory term comes from, on a device holding the weights.
Result<SimTime> recapture_time(const KvBudgetInput& in, const KvBudget& b) {
  if (in.enforce_eager) return SimTime{0};
  MEMSIM_ASSIGN_OR_RETURN(const CaptureRunConfig rc, kv_budget_capture_config(in));
  const GraphEntry* info = graph_strategies().find(in.graph_strategy);
  if (info == nullptr)
    return make_error(ErrorCode::kInvalidArgument, graph_strategies().unknown(in.graph_strategy));
  GpuSpec gpu = in.gpu;
  gpu.capacity = b.capacity - std::min(b.capacity, b.weights + b.comm.total());
  SimClock clock;
  MetricsRecorder metrics(clock);
  const CaptureRunResult r = run_captures_on_sim(rc, gpu, info->defaults(), clock, metrics);
  if (!r.ok)
    return make_error(r.out_of_memory ? ErrorCode::kOutOfMemory : ErrorCode::kInvalidState,
                      "graph recapture: " + r.failure, r.bytes_short);
  return r.capture_time;
}

}  // namespace

bool rollout_uses_sglang_rule(const RlConfig& c, const RlRunSpec& run) {
  return budget_rule(c, run).sglang;
}

std::string rollout_plan_key(const RlConfig& c, const ModelShape& m, const RlRunSpec& run) {
  const BudgetRule r = budget_rule(c, run);
  return fmt::format("{}/{}/{}/tp{}{}", m.name, r.sglang ? "sglang" : "vllm", r.fraction,
                     c.rollout.tensor_parallel, run.teardown ? "/recapture" : "");
}

RolloutPlan plan_rollout(const RlConfig& c, const ModelShape& m, const RlRunSpec& run, bool serve) {
  RolloutPlan p;
  const RlRolloutSpec& ro = c.rollout;
  KvBudgetInput in;
  in.model = m;
  in.gpu = c.gpu;
  const BudgetRule rule = budget_rule(c, run);
  (rule.sglang ? in.mem_fraction_static : in.gpu_memory_utilization) = rule.fraction;
  in.max_num_batched_tokens = ro.serve.max_num_batched_tokens;
  in.max_num_seqs = ro.serve.max_num_seqs;
  in.enforce_eager = ro.enforce_eager;
  in.max_model_len = ro.serve.max_model_len;
  in.kv_block_size = ro.kv_block_size;
  in.parallel.tensor = ro.tensor_parallel;
  Result<KvBudget> b = compute_kv_budget(in);
  if (!b.ok()) {
    p.error = "rollout engine: " + b.error().message;
    return p;
  }
  p.budget = *b;
  if (run.teardown) {
    Result<SimTime> t = recapture_time(in, p.budget);
    if (!t.ok()) {
      p.error = "rollout engine: " + t.error().message;
      return p;
    }
    p.recapture_time = *t;
  }
  // One rank's model under TP (vLLM's and SGLang's sharding); the whole model at TP 1.
  ModelShape rank = m;
  std::shared_ptr<const CollectiveTime> collectives;
  if (ro.tensor_parallel > 1) {
    rank = shard_tensor_parallel(m, ro.tensor_parallel)->rank;  // checked by the budget
    Result<CollectiveTime> ct =
        CollectiveTime::make(c.gpu, ro.tensor_parallel, in.comm.custom_all_reduce);
    if (!ct.ok()) {
      p.error = "rollout engine: " + ct.error().message;
      return p;
    }
    collectives = std::make_shared<const CollectiveTime>(std::move(ct).value());
  }
  p.weight_tensors = rollout_weight_tensors(rank);
  const uint64_t per_token_layer = p.budget.kv_bytes_per_token / m.layers;
  p.kv_layer_bytes = p.budget.kv_blocks * ro.kv_block_size * per_token_layer;
  if (p.kv_layer_bytes == 0) {
    p.error = "rollout engine: no room for one KV block";
    return p;
  }
  for (uint32_t i = 0; i < c.iterations; ++i) {
    SyntheticRequestsConfig rc = ro.requests;
    rc.seed = ro.requests.seed + i;
    const std::vector<RequestSpec> requests = generate_requests(rc);
    RolloutIteration it;
    uint64_t sequences = 0;
    for (const RequestSpec& r : requests) {
      it.train_tokens += uint64_t{r.n} * (r.prompt_tokens + r.output_tokens);
      sequences += r.n;
    }
    if (i == 0 && sequences > 0) p.mean_sequence_tokens = it.train_tokens / sequences;
    if (!serve) {
      p.iterations.push_back(it);
      continue;
    }
    EngineConfig e;
    e.label = run.label;
    e.model = rank;
    e.collectives = collectives;
    e.gpu = c.gpu;
    e.scheduler = ro.scheduler;
    e.serve = ro.serve;
    e.kv_impl = ro.kv_impl;
    e.kv_factory = ro.kv_factory;
    e.kv_budget_bytes = p.kv_layer_bytes * m.layers;
    if (!ro.enforce_eager) e.graph_sizes = p.budget.capture_sizes;
    const ServingResult sr = run_serving(e, requests);
    if (!sr.error.empty()) {
      p.error = fmt::format("rollout iteration {}: {}", i, sr.error);
      return p;
    }
    it.duration = sr.sim_time;
    it.preemptions = sr.counters.preemptions;
    it.output_tokens = sr.output_tokens;
    p.iterations.push_back(it);
  }
  return p;
}

double max_rollout_utilization(const RlConfig& c, const ModelShape& m, const RlRunSpec& run) {
  const bool sglang = budget_rule(c, run).sglang;
  auto fits = [&](int percent) {
    RlRunSpec r = run;
    if (sglang && percent >= 100) return false;  // SGLang's fraction stays below 1
    (sglang ? r.mem_fraction_static : r.gpu_memory_utilization) = percent / 100.0;
    const RolloutPlan plan = plan_rollout(c, m, r, false);
    if (!plan.error.empty()) return false;
    const RlRunResult res = run_rl_with_plan(c, m, r, plan);
    return res.error.empty() && res.oom.empty();
  };
  int lo = 0, hi = 101;  // fits(lo) (0: nothing), !fits(hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo / 100.0;
}

}  // namespace memsim
