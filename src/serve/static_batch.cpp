// static_batch: form a batch when the previous one drained, then vLLM's running phase for it.
#include "src/serve/static_batch.h"

namespace memsim {

void StaticBatch::schedule(ServeState& state, StepPlan& plan) {
  const ServeOptions& o = state.options();
  if (state.running.empty()) {
    // A new batch: swapped-out members of earlier batches first, then waiting requests, up to
    // max_num_seqs sequences. Their KV is allocated step by step as they run.
    // Each comes back with room for its first step's tokens under a whole budget (the running
    // phase below schedules it; ServeState::step_tokens).
    while (!state.swapped.empty()) {
      const uint32_t g = state.swapped.front();
      const Group& G = state.group(g);
      const uint32_t per_seq = state.step_tokens(G, o.max_num_batched_tokens);
      if (per_seq == 0) {
        state.refusal = {Refusal::Kind::kStep, g, G.schedulable_tokens() - G.computed, G.live(),
                         o.max_num_batched_tokens};
        break;
      }
      if (state.running_seqs + G.live() > o.max_num_seqs || !state.swap_in(g, per_seq)) break;
      state.swapped.pop_front();
    }
    while (!state.waiting.empty() &&
           state.running_seqs + state.group(state.waiting.front()).width <= o.max_num_seqs) {
      const uint32_t g = state.waiting.front();
      state.waiting.pop_front();
      Group& G = state.group(g);
      G.status = GroupStatus::kRunning;
      G.computed = 0;
      state.running.push_back(g);
      state.running_seqs += G.live();
    }
  }
  uint32_t budget = o.max_num_batched_tokens;
  schedule_running(state, plan, &budget);
}

}  // namespace memsim
