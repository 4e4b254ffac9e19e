// single_sequence: admit the head request when idle, run it alone, truncate on exhaustion.
#include "src/serve/single_sequence.h"

namespace memsim {

void SingleSequence::schedule(ServeState& state, StepPlan& plan) {
  const uint32_t budget = state.options().max_num_batched_tokens;
  if (state.running.empty()) {
    if (state.waiting.empty()) return;
    const uint32_t g = state.waiting.front();
    uint32_t chunk = 0;
    switch (state.admit(g, budget, &chunk)) {
      case AdmitResult::kAdmitted:
        state.waiting.pop_front();
        state.group(g).status = GroupStatus::kRunning;
        state.running.push_back(g);
        state.running_seqs += state.group(g).live();
        plan.groups.push_back({g, chunk});
        return;
      case AdmitResult::kNoMemory:  // the prompt alone exhausts the pool
      case AdmitResult::kNoBudget:  // no chunked prefill and the prompt exceeds the budget
        state.truncate(g);
        return;
    }
  }
  const uint32_t g = state.running.front();
  Group& G = state.group(g);
  const uint32_t per_seq = state.step_tokens(G, budget);  // the batching schedulers' rule
  if (per_seq == 0) {  // its samples or beams step together and exceed the budget
    state.refusal = {Refusal::Kind::kStep, g, G.schedulable_tokens() - G.computed, G.live(),
                     budget};
    return;
  }
  if (!state.grow_group(g, G.computed + per_seq)) {
    state.truncate(g);  // stop generating, keep what was produced
    return;
  }
  plan.groups.push_back({g, per_seq});
}

}  // namespace memsim
