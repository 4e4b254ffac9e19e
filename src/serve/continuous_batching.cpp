// continuous_batching: vLLM V1 Scheduler.schedule() over request groups, with vLLM V0's swapped
// queue for preemption by swapping.
#include "src/serve/continuous_batching.h"

#include <algorithm>

namespace memsim {

void ContinuousBatching::schedule(ServeState& state, StepPlan& plan) {
  const ServeOptions& o = state.options();
  uint32_t budget = o.max_num_batched_tokens;
  // 1. Running requests, in order: the rest of a prefill (chunked) or one token per sequence.
  const bool preempted = schedule_running(state, plan, &budget);

  // 2. Swapped requests come back before new ones (vLLM V0), and block them while any wait.
  if (!preempted) {
    while (!state.swapped.empty()) {
      const uint32_t g = state.swapped.front();
      Group& G = state.group(g);
      const uint32_t cost = (G.num_tokens() - G.computed) * G.live();
      if (cost > budget || state.running_seqs + G.live() > o.max_num_seqs) break;
      if (!state.swap_in(g)) break;
      state.swapped.pop_front();
      plan.groups.push_back({g, G.num_tokens() - G.computed});
      budget -= cost;
    }
  }

  // 3. Waiting requests in FCFS order, only in a step without preemption.
  if (!preempted && state.swapped.empty()) {
    while (!state.waiting.empty() && budget > 0 && state.running_seqs < o.max_num_seqs) {
      const uint32_t g = state.waiting.front();
      uint32_t chunk = 0;
      if (state.admit(g, budget, &chunk) != AdmitResult::kAdmitted) break;
      state.waiting.pop_front();
      Group& G = state.group(g);
      G.status = GroupStatus::kRunning;
      state.running.push_back(g);
      state.running_seqs += G.live();
      plan.groups.push_back({g, chunk});
      budget -= chunk;
    }
  }
}

}  // namespace memsim
