// continuous_batching: vLLM V1 Scheduler.schedule() over request groups, with vLLM V0's swapped
// queue for preemption by swapping.
#include "src/serve/continuous_batching.h"

#include <algorithm>
#include <utility>

namespace memsim {

void ContinuousBatching::schedule(ServeState& state, StepPlan& plan) {
  const ServeOptions& o = state.options();
  uint32_t budget = o.max_num_batched_tokens;
  // 1. Running requests, in order: each gets min(its tokens left, the budget left).
  const bool preempted = schedule_running(state, plan, &budget);

  // 2. Swapped requests come back before new ones (vLLM V0 _schedule_swapped), and block them
  // while any wait. A single sequence swapped out in the middle of its prefill comes back with a
  // chunk under the budget, as the running phase would give it: V0's chunked-prefill scheduler
  // swaps in unchunked, so a remainder above max_num_batched_tokens never came back there (V0
  // swaps single sequences only when told to; by default it recomputes them).
  if (!preempted) {
    while (!state.swapped.empty() && budget > 0) {
      const uint32_t g = state.swapped.front();
      Group& G = state.group(g);
      const uint32_t per_seq = state.step_tokens(G, budget);
      if (per_seq == 0) {
        state.refusal = {Refusal::Kind::kStep, g, G.schedulable_tokens() - G.computed, G.live(),
                         budget};
        break;
      }
      if (state.running_seqs + G.live() > o.max_num_seqs) break;
      if (!state.swap_in(g, per_seq)) break;
      state.swapped.pop_front();
      plan.groups.push_back({g, per_seq});
      budget -= per_seq * G.live();
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
      // A group back from preemption by free_front recomputes its front in this step too.
      const uint32_t recompute = std::exchange(G.front_freed, 0);
      plan.groups.push_back({g, chunk, recompute});
      budget -= chunk + recompute;
    }
  }
}

}  // namespace memsim
