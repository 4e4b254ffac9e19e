// The running-queue phase shared by the batching schedulers.
#include "src/serve/scheduler.h"

#include <algorithm>

namespace memsim {

// vLLM V1 Scheduler.schedule() (vllm/v1/core/sched/scheduler.py), running-request loop: each
// request gets min(num_new_tokens, token_budget) whatever it is computing, so a request resumed
// after preemption by recompute that has produced output tokens catches up in chunks like a
// prefill (V1 knows no decode phase: num_computed_tokens chases num_tokens). memsim does not
// model long_prefill_token_threshold (V1's default 0: no cap besides the budget).
bool in_flight_only(const Group& G) {
  // The request's last token is being sampled by a step in flight: computed + 1 counts the
  // token a further step would feed, placeholders - 1 the in-flight tokens besides the last.
  if (G.placeholders > 0 && uint64_t{G.computed} + 2 - G.placeholders >=
                                uint64_t{G.spec.prompt_tokens} + G.spec.output_tokens)
    return true;
  // Everything known is computed, the sampled token not yet back (pipeline stages in flight).
  return G.schedulable_tokens() == G.computed;
}

bool schedule_running(ServeState& state, StepPlan& plan, uint32_t* budget) {
  bool preempted = false;
  for (size_t i = 0; i < state.running.size() && *budget > 0;) {
    const uint32_t g = state.running[i];
    Group& G = state.group(g);
    if (in_flight_only(G)) {  // it stays running, and the loop goes on ("continue")
      ++i;
      continue;
    }
    const uint32_t per_seq = state.step_tokens(G, *budget);
    if (per_seq == 0) {  // samples or beams stepping together exceed what is left of the budget
      state.refusal = {Refusal::Kind::kStep, g, G.schedulable_tokens() - G.computed, G.live(),
                       *budget};
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

}  // namespace memsim
