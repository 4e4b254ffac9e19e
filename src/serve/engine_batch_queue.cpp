// The serving engine with steps in flight: vLLM V1's EngineCore.step_with_batch_queue
// (vllm/v1/engine/core.py) under async scheduling (vllm/v1/core/sched/async_scheduler.py) and
// under pipeline parallelism.
//
// vLLM keeps up to max_concurrent_batches steps in flight (vllm/config/vllm.py: 2 under async
// scheduling on one pipeline stage, pipeline_parallel_size otherwise). Each engine step
// schedules a new batch and submits it without waiting; it then blocks on the oldest batch only
// when the queue is full or that batch is already done, and applies its output
// (update_from_output). A step runs its pipeline stages in turn, each stage after its own
// previous step (workload/pipeline_time.h); with one stage, the GPU runs the steps in order.
//
// Under pipeline parallelism the scheduler is the synchronous one: a request whose tokens are
// all computed waits, passed over, until its batch's output is back (in_flight_only), while
// requests not in flight fill the next batch. Under async scheduling, with two in flight:
// - step k+1 is scheduled while step k runs: the host's scheduling, input preparation and
//   launches overlap the GPU's work (a step's host_time), and the GPU runs the steps back to
//   back when the host keeps up;
// - the scheduler has already counted step k's tokens as computed (_update_after_schedule), and
//   a request that samples in step k holds a placeholder for its token
//   (num_output_placeholders), so step k+1 can decode it with the token the GPU has not
//   returned yet;
// - a request whose step k samples its last token is not scheduled in step k+1 (in_flight_only),
//   and its blocks come back when step k's output is applied, after step k+1 was scheduled: one
//   step later than with synchronous scheduling;
// - a request preempted while its step ran still receives that step's token; if it was the
//   last, the request leaves the waiting queue finished (update_from_output's
//   stopped_preempted_reqs).
// Tokens count (first token, completions) when the host applies the output: at the later of
// the step's end on the GPU and the host's return from scheduling the next step.
#include <algorithm>

#include <fmt/format.h>

#include "src/serve/engine_impl.h"

namespace memsim {

bool Engine::set_batch_queue() {
  const uint32_t pp = c_.pipeline ? c_.pipeline->stages() : 1;
  depth_ = c_.serve.async_scheduling ? 2 : pp;
  if (depth_ == 1) return true;
  const char* why = nullptr;
  if (c_.serve.async_scheduling && pp > 1)
    why =
        "under pipeline parallelism vLLM's V1 model runner cannot feed a stage the token a "
        "batch still in the pipeline samples (its V2 runner keeps pp + 1 batches in flight, "
        "which memsim does not model)";
  else if (c_.executor || c_.measured_clock)
    why = "the GPU executor runs each step to its end before the next is scheduled";
  else if (c_.serve.preemption == Preemption::kSwap)
    why = "vLLM V1, whose scheduler this is, has no preemption by swapping";
  else if (c_.serve.preemption == Preemption::kFreeFront)
    why =
        "preemption by free_front (the OrinMLLM seed's strategy 3) is modelled for steps run one "
        "at a time";
  else if (feed_open_ ? any_parallel_ : requests_.any_parallel())
    why =
        "requests with n > 1 or beams step their sequences together (vLLM V0), and vLLM V1's "
        "front-end runs each sample as its own request";
  if (why == nullptr) {
    ring_.assign(depth_, {});
    return true;
  }
  r_.error = fmt::format(
      "{} is not modelled here: {}",
      c_.serve.async_scheduling ? "scheduler.async_scheduling" : "pipeline-parallel serving", why);
  return false;
}

void Engine::submit(const StepPlan& plan, const StepShape& shape) {
  const SimTime host = model_.host_time();
  const SimTime gpu = std::max<SimTime>(0, model_.step_time(shape) - host);
  const SimTime scheduled = clock_.now();
  clock_.advance(host);  // the host prepares and launches the step
  InFlightStep& step = ring_[(in_flight_.head + in_flight_.size++) % depth_];
  step.groups.clear();
  for (const ScheduledGroup& sg : plan.groups) {
    Group& G = groups_[sg.group];
    G.computed += sg.new_tokens;  // _update_after_schedule: computed before the step runs
    const bool samples = G.computed == G.schedulable_tokens();
    if (samples && c_.serve.async_scheduling) ++G.placeholders;
    step.groups.emplace_back(sg.group, samples);
  }
  // The stages run the step in turn, each after its previous step (one stage: the GPU).
  if (c_.pipeline)
    c_.pipeline->stage_times(shape, gpu, &stage_time_);
  else
    stage_time_.assign(1, gpu);
  SimTime t = clock_.now();
  for (size_t j = 0; j < stage_free_.size(); ++j)
    t = stage_free_[j] = std::max(t, stage_free_[j]) + stage_time_[j];
  running_integral_ += double(state_->running_seqs) * double(t - std::max(last_done_, scheduled));
  last_done_ = step.done = t;
  ++r_.steps;
  r_.max_running_seqs = std::max(r_.max_running_seqs, state_->running_seqs);
  if (kv_->has_background()) {  // the strategy's background work, beside the GPU's step
    const SimTime background = run_background(plan, false);  // computed includes the step
    r_.kv_stall_time += std::max<SimTime>(0, background - gpu);
  }
  const InFlightStep& oldest = ring_[in_flight_.head];
  if (in_flight_.size == depth_ || oldest.done <= clock_.now()) await_oldest();
}

void Engine::await_oldest() {
  InFlightStep& step = ring_[in_flight_.head];
  if (step.done > clock_.now()) clock_.advance_to(step.done);
  const SimTime done0 = clock_.now();
  bool any_finished = false;
  for (const auto& [g, samples] : step.groups) {
    if (!samples || g < groups_.begin_index()) continue;
    Group& G = groups_[g];
    if (G.status == GroupStatus::kFinished) continue;
    if (G.placeholders > 0) --G.placeholders;
    ++G.outputs;
    if (G.first_token < 0) G.first_token = clock_.now();
    if (G.outputs < G.spec.output_tokens) continue;
    if (G.status == GroupStatus::kRunning) {
      complete_group(g);
      any_finished = true;
    } else {  // preempted while the step ran: no KV left to release
      auto& w = state_->waiting;
      w.erase(std::find(w.begin(), w.end(), g));
      finish(g);
    }
  }
  if (any_finished) drop_finished();
  r_.kv_critical_time += clock_.now() - done0;
  in_flight_.head = (in_flight_.head + 1) % depth_;
  --in_flight_.size;
}

}  // namespace memsim
