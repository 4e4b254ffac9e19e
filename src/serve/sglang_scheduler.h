// sglang: SGLang's scheduler (python/sglang/srt/managers/scheduler.py, schedule_policy.py,
// schedule_batch.py), which forms prefill batches by its PrefillAdder and decodes the rest.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "src/serve/scheduler.h"

namespace memsim {

// SGLang's event loop without overlap scheduling (event_loop_normal) and without mixed chunks
// (enable_mixed_chunk off, its default). Each step is either a prefill batch or a decode step:
// - Prefill first (get_next_batch_to_run): unless the running batch is marked full or nothing
//   waits (and no chunked prefill is in progress), a PrefillAdder continues the chunked request
//   (add_chunked_req) and then admits waiting requests in the policy's order until one does
//   not fit (add_one_req). Its budgets:
//     rem_total = free + evictable tokens (less the evictable prefixes it locks)
//                 - sum over running requests of min(max_new - output, clip) x new_token_ratio
//                 - per admitted request: its extend tokens + min(max_new, clip) (full, not x
//                   ratio; 0 for a chunk that is not the last)
//     rem_input = max_prefill_tokens - extend tokens;  rem_chunk = chunked_prefill_size - ...
//   A request needs extend + min(max_new - output, clip) < rem_total (NO_TOKEN marks the batch
//   full until a request leaves it); over rem_chunk it is cut to a page-aligned chunk and held
//   as the one chunked request; over rem_input (not the first) it waits (OTHER).
//   The batch is full at max_running_requests.
// - Otherwise the running batch decodes one token each (update_running_batch): if the free and
//   evictable tokens do not cover the step's new pages (check_decode_mem), requests are
//   retracted, fewest outputs first, then longest input, until they do (at least one, never
//   the last), their prompts kept cached, to the back of the queue; new_token_ratio becomes
//   min(1, (sum outputs + retract_decode_steps x n) / (sum max_new + 1)) over those left. A
//   decode step without retraction decays the ratio by (init - min) / decay_steps to its min;
//   an idle engine resets it.
// Policies (SchedulePolicy.calc_priority): fcfs (the queue's order); lpm (longest cached
// prefix first, stable; fcfs beyond 128 waiting); dfs-weight (the radix tree walked heaviest
// subtree first, each node's own requests after its children's); lof (longest output first);
// random.
class SglangScheduler final : public Scheduler {
 public:
  std::string_view name() const override { return "sglang"; }
  void schedule(ServeState& state, StepPlan& plan) override;
  // Its new_token_ratio decays every decode step and its memory check runs before each: steps
  // are taken one by one.
  bool allows_fast_decode() const override { return false; }

  double new_token_ratio() const { return ratio_; }  // for tests

 private:
  struct Budget;
  void init(ServeState& state);
  bool prefill(ServeState& state, StepPlan& plan);  // false: no prefill batch this step
  bool continue_chunked(ServeState& state, StepPlan& plan, Budget& b);
  void order_waiting(ServeState& state);
  void collect_batch(const ServeState& state);  // batch_ = the running batch (no chunked req)
  void decode(ServeState& state, StepPlan& plan);
  bool decode_fits(ServeState& state, const std::vector<uint32_t>& batch) const;
  uint32_t reserved_outputs(const Group& G) const;  // min(max_new - outputs, clip)

  bool ready_ = false;
  uint32_t max_running_ = 0;
  uint32_t clip_ = 4096;
  double init_ratio_ = 0, min_ratio_ = 0, decay_ = 0, ratio_ = 0;
  int64_t chunked_ = -1;     // the request whose prefill is in progress, chunk by chunk
  bool batch_full_ = false;  // running_batch.batch_is_full
  size_t last_running_ = 0;  // running requests after the last step it planned
  std::vector<uint32_t> batch_, order_;
};

}  // namespace memsim
