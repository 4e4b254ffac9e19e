// The serving engine's internals (src/serve/engine.cpp): one engine's event loop over its
// scheduler, KV strategy and backend, which run_serving drives alone and the data-parallel driver
// (src/serve/dp_serving.cpp) drives as one of several replicas.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/metrics.h"
#include "src/serve/engine.h"
#include "src/serve/latency_samples.h"
#include "src/serve/scheduler.h"
#include "src/serve/serve_state.h"
#include "workload/step_time.h"

namespace memsim {

// A scheduler's request counts, as vLLM's Scheduler.get_request_counts reports them: requests
// waiting (preempted ones included) and running.
struct RequestCounts {
  uint64_t waiting = 0, running = 0;
  bool operator==(const RequestCounts&) const = default;
};

// The figures a run derives at its end from its counts, sim_time and latencies: percentiles,
// rates, and the time-weighted means of running sequences and KV waste (their integrals over
// simulated ns divided by sim_time).
void set_rate_figures(ServingResult& r, LatencySamples& latency, double running_integral,
                      double waste_integral);

class Engine {
 public:
  Engine(const EngineConfig& c, const RequestTable& requests)
      : c_(c),
        requests_(requests),

        metrics_(clock_),
        model_(c.collectives && !c.step_profile ? StepTimeModel(c.model, c.gpu, c.collectives)
                                                : StepTimeModel(c.model, c.gpu, c.step_profile)) {}

  ServingResult run();  // start, advance to the end, finish

  // Driven from outside (data parallelism, src/serve/dp_serving.h): the requests table grows
  // while the engine runs. open_feed (before start): the table will hold at most `capacity`
  // requests, some with several samples or beams when `any_parallel`. advance(until): runs the
  // event loop until the clock reaches `until` (the step that crosses it ends past it) or, once
  // the feed is closed, until every request has finished. A request appended between two
  // advances with an arrival at or after the first one's `until` is served exactly as if the
  // table had held it from the start (an engine still in a step then sees it when the step
  // ends, as it would). finish: the run's figures.
  bool start();  // the scheduler, KV manager, backend, swap space, executor (false: r_.error)
  void open_feed(size_t capacity, bool any_parallel);
  void close_feed() { feed_open_ = false; }
  void advance(SimTime until);
  ServingResult finish();
  ServingResult take_result() { return std::move(r_); }  // after a failed start: why
  SimTime origin() const { return t0_; }                 // arrivals are offsets from it
  // The scheduler's (waiting, running) request counts after the last step that ended at or before
  // `t` (vLLM's get_request_counts, published after each step), for t the last advance's `until`
  // (only the step that crossed it can have ended after it).
  RequestCounts counts_at(SimTime t) const {
    return counts_.time <= t ? counts_.now : counts_.before;
  }
  // When those counts last changed (the engine reported new stats), as of `t` likewise.
  SimTime counts_changed_at(SimTime t) const {
    return counts_.time <= t ? counts_.time : counts_.before_time;
  }
  const LatencySamples& latencies() const { return latency_; }

 private:
  void begin_loop();           // the clock origin and the first sample
  void loop_step();            // one pass of the event loop: arrivals, a step, completions, samples
  void note_counts();          // after a step: the counts it leaves
  void report();               // the run's figures, then every byte back
  void add_group(uint32_t g);  // request g arrived
  void record(const Group& G);  // its figures (latencies, tokens) at the end of its run
  void complete_step(const StepPlan& plan);
  void fork_children(Group& G);
  void reshuffle_beams(Group& G);
  void finish(uint32_t g);
  void complete_group(uint32_t g);  // generated its last token: release KV, leave the batch
  void drop_finished();             // compacts the running queue
  void sample();
  StepShape shape_of(const StepPlan& plan);
  uint64_t fast_decode(SimTime stop_at);
  // Advances the clock over a step of `compute` time; with a strategy that works in the
  // background, its background step runs overlapped with the compute.
  void run_step_time(const StepPlan& plan, SimTime compute);
  // The KV strategy's background step for the sequences `plan` runs, told each one's tokens
  // after the step (computed, plus the step's tokens when `add_step_tokens`); returns its time
  // (counted in kv_background_time).
  SimTime run_background(const StepPlan& plan, bool add_step_tokens);
  // Runs the executor over the step `plan` (of shape `shape`) describes, before its tokens count
  // as computed.
  Status execute(const StepPlan& plan, const StepShape& shape);
  std::string events_since_check();  // what happened since the last check (empty: nothing)
  // The step planned nothing (see the Scheduler contract): goes on when the scheduler moved
  // otherwise, advances to the next arrival, or ends / fails on the request nothing can place.
  // false: the run fails (r_.error names the request and why).
  bool on_empty_plan(bool preempted, bool ended, size_t next);
  bool place_swapped(uint32_t g);  // nothing runs: g heads the swapped queue
  bool place_waiting(uint32_t g);  // nothing runs: g heads the waiting queue
  void maybe_sample();             // samples the gauges when the sample interval passed
  // Steps in flight (engine_batch_queue.cpp): vLLM V1's EngineCore.step_with_batch_queue.
  bool set_batch_queue();  // its depth from the options (false: r_.error says why not)
  void submit(const StepPlan& plan, const StepShape& shape);  // issues a step, maybe awaits one
  void await_oldest();                // waits for the oldest step in flight and applies its output
  std::string who(uint32_t g) const;  // "request R (group g)"
  std::string describe(const Refusal& why) const;
  std::string unplaced(uint32_t g, const char* where) const;

  const EngineConfig& c_;
  const RequestTable& requests_;
  SimClock clock_;
  std::unique_ptr<Backend> backend_;
  MetricsRecorder metrics_;
  StepTimeModel model_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<ServeState> state_;
  DevPtr swap_space_ = 0;
  bool idle_retry_ = false;  // the last step preempted everything and planned nothing
  GroupWindow groups_;
  LatencySamples latency_;
  SeqId next_seq_ = 0;
  uint64_t forks_ = 0;
  std::unique_ptr<StepExecutor> executor_;
  std::mt19937_64 validate_rng_;
  struct Events {  // counters whose change triggers a check
    uint64_t forks = 0, cow = 0, evicted = 0, preemptions = 0, swap_ins = 0;
  } checked_at_;
  StepWork work_;
  std::vector<SeqLength> after_step_;
  uint64_t done_ = 0;
  uint64_t length_capped_ = 0;
  uint64_t loops_ = 0;  // scheduling loops, for the progress hook
  SimTime t0_ = 0, last_sample_ = 0;
  // The event loop's position (kept between advance calls).
  SimTime next_sample_ = 0, horizon_ = INT64_MAX;
  size_t next_ = 0;
  StepPlan plan_;
  // A step whose output has not arrived: the groups it ran, whether each samples a token, and
  // when its output is back. A ring of depth_ entries (in_flight_ counts them from the oldest).
  struct InFlightStep {
    std::vector<std::pair<uint32_t, bool>> groups;
    SimTime done = 0;
  };
  std::vector<InFlightStep> ring_;
  struct {
    size_t head = 0, size = 0;
    bool empty() const { return size == 0; }
  } in_flight_;
  uint32_t depth_ = 1;  // steps in flight at most (1: each step's output before the next)
  std::vector<SimTime> stage_free_;  // when each pipeline stage finishes the steps issued so far
  std::vector<SimTime> stage_time_;  // the step being issued: each stage's time
  SimTime last_done_ = 0;            // when the last step issued ends
  bool fast_ = false, stop_ = false, threw_ = false;
  bool feed_open_ = false;
  size_t capacity_ = 0;  // the most requests the table will hold
  bool any_parallel_ = false;
  struct {
    RequestCounts before, now;
    SimTime time = 0, before_time = 0;  // when `now` and `before` were reported
  } counts_;
  double waste_integral_ = 0, waste_last_ = 0, running_integral_ = 0;
  ServingResult r_;
};

}  // namespace memsim
