// The scheduler registry, its option parsing, and the running-queue phase shared by the
// batching schedulers.
#include "src/serve/scheduler.h"

#include <algorithm>

#include "src/serve/continuous_batching.h"
#include "src/serve/single_sequence.h"
#include "src/serve/static_batch.h"

namespace memsim {

// vLLM V1 Scheduler.schedule() (vllm/v1/core/sched/scheduler.py), running-request loop: each
// request gets min(num_new_tokens, token_budget) whatever it is computing, so a request resumed
// after preemption by recompute that has produced output tokens catches up in chunks like a
// prefill (V1 knows no decode phase: num_computed_tokens chases num_tokens). memsim does not
// model long_prefill_token_threshold (V1's default 0: no cap besides the budget).
bool schedule_running(ServeState& state, StepPlan& plan, uint32_t* budget) {
  bool preempted = false;
  for (size_t i = 0; i < state.running.size() && *budget > 0;) {
    const uint32_t g = state.running[i];
    Group& G = state.group(g);
    const uint32_t per_seq = state.step_tokens(G, *budget);
    if (per_seq == 0) {  // samples or beams stepping together exceed what is left of the budget
      state.refusal = {Refusal::Kind::kStep, g, G.num_tokens() - G.computed, G.live(), *budget};
      break;
    }
    const uint32_t target = G.computed + per_seq;
    bool scheduled = true;
    while (!state.grow_group(g, target)) {
      preempted = true;
      const size_t v = state.pick_victim();
      const uint32_t victim = state.running[v];
      if (v < i) {  // already in this step's plan: take it back out
        auto it = std::find_if(plan.groups.begin(), plan.groups.end(),
                               [&](const ScheduledGroup& s) { return s.group == victim; });
        *budget += it->new_tokens * state.group(victim).live();
        plan.groups.erase(it);
        --i;
      }
      state.preempt(victim);
      if (victim == g) {  // it was its own victim (vLLM: "Cannot schedule this request")
        state.refusal = {Refusal::Kind::kPreempt, g, target, G.live(), 0};
        scheduled = false;
        break;
      }
    }
    if (!scheduled) break;
    plan.groups.push_back({g, per_seq});
    *budget -= per_seq * G.live();
    ++i;
  }
  return preempted;
}

const std::vector<SchedulerInfo>& schedulers() {
  static const std::vector<SchedulerInfo> kRegistry = {
      {"continuous_batching",
       "vLLM V1: token budget, max_num_seqs, chunked prefill, preemption by recompute or swap",
       {"max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "preemption", "victim",
        "swap_space", "beam_fork_prob"},
       [] { return std::make_unique<ContinuousBatching>(); }},
      {"static_batch",
       "a batch is formed, run to completion, then the next (FasterTransformer / pre-Orca)",
       {"max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "preemption", "victim",
        "swap_space", "beam_fork_prob"},
       [] { return std::make_unique<StaticBatch>(); }},
      {"single_sequence",
       "one request at a time; KV exhaustion truncates its generation (OrinMLLM, seed 10.4)",
       {"max_num_batched_tokens", "chunked_prefill", "beam_fork_prob"},
       [] { return std::make_unique<SingleSequence>(); }},
  };
  return kRegistry;
}

const SchedulerInfo* find_scheduler(std::string_view name) {
  for (const auto& s : schedulers())
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string> scheduler_names() {
  std::vector<std::string> names;
  for (const auto& s : schedulers()) names.push_back(s.name);
  return names;
}

ServeOptions parse_scheduler_options(const ConfigNode& node, const SchedulerInfo& info,
                                     ServeOptions o) {
  std::vector<std::string> allowed = {"impl"};
  allowed.insert(allowed.end(), info.params.begin(), info.params.end());
  node.expect_keys(allowed);
  if (auto v = node.find("max_num_seqs"))
    o.max_num_seqs = static_cast<uint32_t>(v->as_uint_in(1, 1u << 20));
  if (auto v = node.find("max_num_batched_tokens"))
    o.max_num_batched_tokens = static_cast<uint32_t>(v->as_uint_in(1, 1u << 24));
  if (auto v = node.find("chunked_prefill")) o.chunked_prefill = v->as_bool();
  if (auto v = node.find("preemption"))
    o.preemption =
        v->as_choice({"recompute", "swap"}) == "swap" ? Preemption::kSwap : Preemption::kRecompute;
  if (auto v = node.find("victim"))
    o.victim = v->as_choice({"last_arrived", "fewest_decoded"}) == "fewest_decoded"
                   ? Victim::kFewestDecoded
                   : Victim::kLastArrived;
  if (auto v = node.find("swap_space")) o.swap_space = v->as_bytes();
  if (auto v = node.find("beam_fork_prob")) o.beam_fork_prob = v->as_double_in(0, 1);
  if (info.name == "single_sequence") o.max_num_seqs = 1;
  return o;
}

}  // namespace memsim
