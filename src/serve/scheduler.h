// Role interface of the scheduler family: which requests run in the next engine step, with how
// many tokens each, and who is preempted when KV memory runs out.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "src/serve/serve_state.h"

namespace memsim {

struct ScheduledGroup {
  uint32_t group = 0;
  uint32_t new_tokens = 0;  // tokens computed per sequence of the group this step
  // Tokens [0, recompute) computed again first (prefill work): the front whose KV preemption by
  // free_front released (Group::front_freed). Counted in the step's token budget.
  uint32_t recompute = 0;
};

struct StepPlan {
  std::vector<ScheduledGroup> groups;
  void clear() { groups.clear(); }
};

// Contract (every implementation):
// - schedule() fills `plan` from state's queues and has already made the KV of every scheduled
//   sequence hold computed + new_tokens tokens (ServeState::grow_group / admit) when it
//   returns, so the step can run. Groups it admits move from state.waiting (or state.swapped)
//   to state.running; groups it preempts or truncates leave running through ServeState.
// - A step computes at most options().max_num_batched_tokens tokens and runs at most
//   options().max_num_seqs sequences; a group appears at most once.
// - An empty plan means nothing can run now. The engine then goes on only if the scheduler
//   made progress otherwise (it ended a request, or preempted one: the freed KV is tried next
//   step), else advances to the next arrival; with nothing running it ends the head of the
//   swapped or waiting queue (it can never fit, per `state.refusal`) or fails naming it.
//   A group left in `running` unscheduled with no preemption fails the run, named.
// - Deterministic: the same state gives the same plan (random choices use state.rng()).
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual std::string_view name() const = 0;
  virtual void schedule(ServeState& state, StepPlan& plan) = 0;
  // Whether the engine may take stretches of pure-decode steps together without asking
  // (Engine::fast_decode): only for a scheduler whose decode steps change nothing of its own.
  virtual bool allows_fast_decode() const { return true; }
};

// vLLM V1's first scheduling phase, shared by the batching schedulers: every running group in
// order gets ServeState::step_tokens() under *budget (a single sequence: the rest of its prefill
// or of its recompute, chunked, or one decode token; samples and beams: one token each, unsplit,
// and the phase stops at a group they do not fit); when KV runs out, the victim
// (options().victim) is preempted and the allocation retried; if the victim is the group itself,
// the phase stops. A victim scheduled earlier in this step is taken back out of the plan.
// Returns whether anything was preempted.
bool schedule_running(ServeState& state, StepPlan& plan, uint32_t* budget);

// A running group with nothing to compute until a step in flight returns its output, which the
// running phase passes over (vLLM V1 Scheduler.schedule(): "Async scheduling: Avoid scheduling
// an extra step when we are sure that the previous step has reached request.max_tokens", and
// num_new_tokens == 0, "PP>1 and we have already scheduled all prompt tokens but they are not
// finished yet"). Never true when steps run one at a time: a step's output arrives before the
// next is scheduled.
bool in_flight_only(const Group& G);

}  // namespace memsim
