// The serving engine's event loop: arrivals, scheduling, roofline-timed steps, sampling of
// tokens (forks for parallel samples and beams), completion, gauges and per-run figures.
#include "src/serve/engine.h"

#include "src/serve/engine_impl.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <queue>
#include <random>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "src/serve/scheduler_registry.h"
#include "workload/step_time.h"

namespace memsim {
namespace {

// Token streams: the shared prefix of a group, a request's own prompt, a sequence's output.
uint64_t prefix_stream(int32_t group) {
  return (1ull << 62) | static_cast<uint32_t>(group);
}
uint64_t prompt_stream(uint64_t request) {
  return (2ull << 62) | request;
}
uint64_t output_stream(uint64_t request, uint64_t fork) {
  return (3ull << 62) | (request << 24) | fork;
}

}  // namespace

void Engine::add_group(uint32_t g) {
  const RequestSpec q = requests_[g];
  Group& G = groups_.add();
  G.spec = q;
  G.width = std::max(q.n, q.beam_width);
  // vLLM stops a sequence at max_model_len tokens (finish reason "length").
  const uint32_t max_len = c_.serve.max_model_len;
  if (q.prompt_tokens < max_len && q.prompt_tokens + q.output_tokens > max_len) {
    G.spec.output_tokens = max_len - q.prompt_tokens;
    ++length_capped_;
  }
  Sequence s;
  s.id = g;  // prefill sequences are numbered by request, forks from the request count on
  if (q.prefix_group >= 0) s.content.append(prefix_stream(q.prefix_group), q.prefix_tokens);
  s.content.append(prompt_stream(q.id), q.prompt_tokens - s.content.size());
  s.content.append(output_stream(q.id, 0), G.spec.output_tokens);
  // Only requests of its prefix group share tokens with it, and only the prefix; forks and
  // beams inherit the hint through slice().
  if (c_.defer_private_hashes)
    s.content.set_private_from(q.prefix_group >= 0 ? q.prefix_tokens : 0);
  G.seqs.push_back(std::move(s));
}

void Engine::record(const Group& G) {
  if (G.rejected) return;
  r_.output_tokens += uint64_t{G.outputs} * G.live();
  if (G.truncated) ++r_.truncated;
  if (G.status == GroupStatus::kFinished) ++r_.finished;
  if (G.first_token < 0) return;
  latency_.add_ttft(G.first_token - t0_ - G.spec.arrival);
  if (G.finished >= 0) {
    latency_.add_e2e(G.finished - t0_ - G.spec.arrival);
    if (G.outputs > 1)
      latency_.add_tpot_ms(double(G.finished - G.first_token) / 1e6 / (G.outputs - 1));
  }
}

StepShape Engine::shape_of(const StepPlan& plan) {
  StepShape s;
  for (const ScheduledGroup& sg : plan.groups) {
    const Group& G = groups_[sg.group];
    const double n = sg.new_tokens, before = G.computed, live = G.live();
    // A front recomputed after free_front: a prefill of tokens [0, r) of one sequence.
    const double r = sg.recompute;
    s.new_tokens += sg.recompute;
    s.kv_read_tokens += sg.recompute;
    s.attn_pairs += r * (r + 1) / 2;
    s.num_seqs += G.live();
    s.new_tokens += uint64_t{sg.new_tokens} * G.live();
    s.kv_read_tokens += uint64_t{G.computed + sg.new_tokens} * G.live();
    s.attn_pairs += live * (n * before + n * (n + 1) / 2);
    if (sg.new_tokens == 1) {
      s.decode_seqs += G.live();
      s.decode_kv_tokens += uint64_t{G.computed + 1} * G.live();
      if (G.live()) s.decode_max_kv = std::max(s.decode_max_kv, G.computed + 1);
    }
  }
  return s;
}

void Engine::fork_children(Group& G) {
  const uint32_t prompt_end = G.computed;
  for (uint32_t k = 1; k < G.width; ++k) {
    Sequence child;
    child.id = next_seq_++;
    child.content = G.seqs[0].content.slice(0, prompt_end);
    child.content.append(output_stream(G.spec.id, ++forks_), G.spec.output_tokens);
    child.fork_from = 0;
    G.seqs.push_back(std::move(child));
  }
  state_->running_seqs += G.width - 1;
}

void Engine::reshuffle_beams(Group& G) {
  // Beam search keeps the best `width` continuations: a beam whose candidates lost is replaced
  // by a fork of a surviving sibling (vLLM V0 beam search forks and frees sequences per step).
  std::uniform_real_distribution<double> coin(0, 1);
  std::vector<bool> replaced(G.width, false), parent(G.width, false);
  for (uint32_t b = 0; b < G.width; ++b) {
    if (coin(state_->rng()) >= c_.serve.beam_fork_prob) continue;
    const uint32_t p = (b + 1 + static_cast<uint32_t>(state_->rng()() % (G.width - 1))) % G.width;
    if (replaced[p] || parent[b]) continue;  // a parent survives this step; forks never chain
    replaced[b] = true;
    parent[p] = true;
    Sequence& s = G.seqs[b];
    state_->sync(s);
    kv_->release(s.id, s.content.slice(0, G.computed));
    s.kv_tokens = s.synced = s.capacity = 0;
    s.content = G.seqs[p].content.slice(0, G.computed);
    s.content.append(output_stream(G.spec.id, ++forks_),
                     G.spec.prompt_tokens + G.spec.output_tokens - G.computed);
    s.fork_from = static_cast<int32_t>(p);
  }
}

void Engine::finish(uint32_t g) {
  Group& G = groups_[g];
  G.status = GroupStatus::kFinished;
  G.finished = clock_.now();
  ++done_;
  record(G);
  G.recorded = true;
  G.seqs = {};  // its figures are recorded: free its token runs
}

void Engine::complete_group(uint32_t g) {
  state_->release_group(g);
  state_->running_seqs -= groups_[g].live();
  finish(g);
}

void Engine::drop_finished() {
  auto& run = state_->running;
  run.erase(std::remove_if(run.begin(), run.end(),
                           [&](uint32_t g) { return groups_[g].status == GroupStatus::kFinished; }),
            run.end());
}

std::string Engine::events_since_check() {
  const KvStats s = kv_->stats();
  const ServeCounters& k = state_->counters();
  const Events now{forks_, s.cow_copies, s.evicted_blocks, k.preemptions, k.swap_ins};
  std::string why;
  auto add = [&](bool changed, const char* what) {
    if (changed) why += why.empty() ? what : std::string(", ") + what;
  };
  add(now.forks != checked_at_.forks, "fork");
  add(now.cow != checked_at_.cow, "copy-on-write");
  add(now.evicted != checked_at_.evicted, "eviction");
  add(now.preemptions != checked_at_.preemptions, "preemption");
  add(now.swap_ins != checked_at_.swap_ins, "swap-in");
  checked_at_ = now;
  return why;
}

std::string Engine::who(uint32_t g) const {
  return fmt::format("request {} (group {})", groups_[g].spec.id, g);
}

std::string Engine::describe(const Refusal& why) const {
  return describe_refusal(why, c_.serve.max_num_batched_tokens, kv_->stats().block_tokens,
                          r_.kv_capacity_tokens);
}

std::string Engine::unplaced(uint32_t g, const char* where) const {
  const Refusal& why = state_->refusal;
  return fmt::format("scheduler '{}': {} {} and cannot be placed with nothing running: {}",
                     c_.scheduler, who(g), where,
                     why.group == g ? describe(why) : std::string("the scheduler gave no reason"));
}

// Nothing runs, so no KV is held and the whole budget is free: what failed now fails forever.
bool Engine::place_swapped(uint32_t g) {
  const Group& G = groups_[g];
  const Refusal& why = state_->refusal;
  if (G.live() > c_.serve.max_num_seqs) {
    r_.error = fmt::format(
        "scheduler '{}': {} is swapped out with {} sequences, more than "
        "max_num_seqs {}: it can never come back",
        c_.scheduler, who(g), G.live(), c_.serve.max_num_seqs);
    return false;
  }
  // vLLM V0 _schedule_swapped: a group whose KV can never fit (AllocStatus.NEVER) is failed
  // (FINISHED_IGNORED) and the others go on; memsim counts it rejected.
  if (why.group == g &&
      (why.kind == Refusal::Kind::kSwapIn || why.kind == Refusal::Kind::kPreempt)) {
    state_->drop_swapped(g, describe(why));
    return true;
  }
  r_.error = unplaced(g, "is swapped out");
  return false;
}

bool Engine::place_waiting(uint32_t g) {
  const Group& G = groups_[g];
  const Refusal& why = state_->refusal;
  // vLLM V0 _schedule_prefills ignores (FINISHED_IGNORED) a prompt over its limit (the budget,
  // without chunked prefill) or whose blocks can never be allocated (AllocStatus.NEVER).
  if (why.group == g && (why.kind == Refusal::Kind::kBudget || why.kind == Refusal::Kind::kMemory ||
                         why.kind == Refusal::Kind::kPreempt)) {
    state_->reject(g, describe(why));
    return true;
  }
  if (G.width > c_.serve.max_num_seqs) {
    r_.error = fmt::format(
        "scheduler '{}': {} asks for {} sequences (n / beam_width), more than "
        "max_num_seqs {}: no batch can hold it",
        c_.scheduler, who(g), G.width, c_.serve.max_num_seqs);
    return false;
  }
  r_.error = unplaced(g, "waits");
  return false;
}

bool Engine::on_empty_plan(bool preempted, bool ended, size_t next) {
  ServeState& st = *state_;
  // Progress without a step: the scheduler ended requests, or preempted (a step that preempts
  // admits nothing; the freed KV is tried next step). While groups still run, each such step
  // shrinks `running` (no scheduler refills it then); once none run, one more try decides.
  if (ended) {
    idle_retry_ = false;
    return true;
  }
  if (preempted && (!st.running.empty() || !idle_retry_)) {
    idle_retry_ = st.running.empty();
    return true;
  }
  idle_retry_ = false;
  if (!st.running.empty()) {
    const uint32_t g = st.running.front();
    const Group& G = groups_[g];
    const Refusal& why = st.refusal;
    r_.error = fmt::format(
        "scheduler '{}' scheduled nothing while {} requests run: {} {}", c_.scheduler,
        st.running.size(), who(g),
        why.group == g && why.kind != Refusal::Kind::kNone
            ? describe(why)
            : fmt::format("was neither scheduled nor preempted ({} new tokens x {} sequences, "
                          "max_num_batched_tokens {})",
                          G.schedulable_tokens() - G.computed, G.live(),
                          c_.serve.max_num_batched_tokens));
    return false;
  }
  if (!st.swapped.empty()) return place_swapped(st.swapped.front());
  if (!st.waiting.empty()) return place_waiting(st.waiting.front());
  if (next < requests_.size()) {
    clock_.advance_to(t0_ + requests_.arrival(next));
    return true;
  }
  if (feed_open_) {  // idle until the next request is handed over
    if (horizon_ == INT64_MAX)
      throw std::logic_error("engine: advanced without bound while its feed is open");
    clock_.advance_to(std::max(clock_.now(), horizon_));
    return true;
  }
  if (done_ == requests_.size()) return false;  // the last arrivals were rejected: all done
  r_.error = fmt::format("{} of {} requests are neither waiting, running, swapped nor finished",
                         requests_.size() - done_, requests_.size());
  return false;
}

Status Engine::execute(const StepPlan& plan, const StepShape& shape) {
  work_.seqs.clear();
  for (const ScheduledGroup& sg : plan.groups) {
    const Group& G = groups_[sg.group];
    if (sg.recompute)  // its front first: the executor writes tokens [0, recompute) again
      work_.seqs.push_back({G.spec.id, 0, G.seqs[0].id, &G.seqs[0].content, 0, sg.recompute});
    for (uint32_t i = 0; i < G.live(); ++i) {
      const Sequence& s = G.seqs[i];
      work_.seqs.push_back({G.spec.id, i, s.id, &s.content, G.computed, sg.new_tokens});
    }
  }
  work_.reason = events_since_check();
  const bool sampled =
      std::uniform_real_distribution<double>(0, 1)(validate_rng_) < c_.validate_sample;
  work_.validate = sampled || !work_.reason.empty();
  if (work_.reason.empty()) work_.reason = "sampled";
  work_.simulated_attention = model_.attention_time(shape);
  const Status st = executor_->run_step(work_);
  ++work_.step;
  return st;
}

void Engine::complete_step(const StepPlan& plan) {
  bool any_finished = false;
  for (const ScheduledGroup& sg : plan.groups) {
    Group& G = groups_[sg.group];
    G.computed += sg.new_tokens;
    if (G.computed < G.num_tokens()) continue;  // a prefill chunk: nothing sampled yet
    ++G.outputs;
    if (G.first_token < 0) G.first_token = clock_.now();
    if (G.outputs >= G.spec.output_tokens) {
      complete_group(sg.group);
      any_finished = true;
    } else if (G.outputs == 1 && G.width > 1 && G.live() == 1) {
      fork_children(G);
    } else if (G.spec.beam_width > 1 && G.live() == G.width && c_.serve.beam_fork_prob > 0) {
      reshuffle_beams(G);
    }
  }
  if (any_finished) drop_finished();
}

void Engine::run_step_time(const StepPlan& plan, SimTime compute) {
  if (!kv_->has_background()) {
    clock_.advance(compute);
    return;
  }
  const SimTime background = run_background(plan, true);
  if (background > compute)
    r_.kv_stall_time += background - compute;
  else
    clock_.advance(compute - background);
}

SimTime Engine::run_background(const StepPlan& plan, bool add_step_tokens) {
  after_step_.clear();
  for (const ScheduledGroup& sg : plan.groups) {
    const Group& G = groups_[sg.group];
    const uint32_t tokens = G.computed + (add_step_tokens ? sg.new_tokens : 0);
    for (const Sequence& s : G.seqs) after_step_.push_back({s.id, tokens});
  }
  const SimTime t0 = clock_.now();
  kv_->background_step(after_step_);
  const SimTime background = clock_.now() - t0;
  r_.kv_background_time += background;
  return background;
}

void Engine::sample() {
  state_->sync_all();
  const KvStats s = kv_->stats();
  const ServeCounters& k = state_->counters();
  const double waste = s.slots_allocated
                           ? 100.0 * double(s.slots_allocated - s.tokens_stored) / s.slots_allocated
                           : 0.0;
  const SimTime now = clock_.now();
  waste_integral_ += waste_last_ * double(now - last_sample_);
  waste_last_ = waste;
  last_sample_ = now;
  r_.peak_used_blocks = std::max(r_.peak_used_blocks, s.used_blocks);
  r_.peak_kv_bytes = std::max(r_.peak_kv_bytes, s.used_blocks * s.block_bytes);
  metrics_.set("kv.used_blocks", double(s.used_blocks));
  metrics_.set("kv.cached_blocks", double(s.cached_blocks));
  metrics_.set("kv.free_blocks", double(s.free_blocks));
  metrics_.set("kv.fragmentation_tokens", double(s.slots_allocated - s.tokens_stored));
  metrics_.set("kv.waste_pct", waste);
  metrics_.set("kv.cow_copies", double(s.cow_copies));
  metrics_.set("kv.evicted_blocks", double(s.evicted_blocks));
  metrics_.set("prefix_hit_rate",
               k.prefix_query_tokens ? double(k.prefix_hit_tokens) / k.prefix_query_tokens : 0.0);
  metrics_.set("preemptions", double(k.preemptions));
  metrics_.set("swapped_bytes", double(k.swapped_bytes));
  metrics_.set("oom_events", double(k.oom_events));
  metrics_.set("running_seqs", double(state_->running_seqs));
  metrics_.set("waiting", double(state_->waiting.size()));
  metrics_.set("swapped", double(state_->swapped.size()));
  metrics_.set("finished", double(done_));
}

// Several pure-decode steps at once, exactly as the step-by-step path would run them: when every
// running group is decoding (no prefill, fork, beam or swapped group; nothing admissible waits),
// each step adds one token per sequence and only sequences crossing their KV capacity touch the
// KV manager. Those grows run in the step and running order the scheduler would use; the run
// stops before a step whose grow fails (the scheduler then preempts), after the step that passes
// `stop_at` (next arrival or sample), or at the first completion. Returns the steps taken.
uint64_t Engine::fast_decode(SimTime stop_at) {
  ServeState& st = *state_;
  const ServeOptions& o = c_.serve;
  if (st.running.empty() || !st.swapped.empty() || st.running_seqs > o.max_num_batched_tokens ||
      (!st.waiting.empty() && st.running_seqs < o.max_num_seqs))
    return 0;
  uint64_t kmax = UINT64_MAX, kv_read = 0;
  uint32_t max_kv = 0;
  for (uint32_t g : st.running) {
    const Group& G = groups_[g];
    if (G.outputs == 0 || G.computed + 1 != G.num_tokens() || G.spec.beam_width > 1 ||
        (G.width > 1 && G.live() < G.width))
      return 0;
    for (const Sequence& s : G.seqs)
      if (s.fork_from >= 0) return 0;
    kmax = std::min<uint64_t>(kmax, G.spec.output_tokens - G.outputs);
    kv_read += uint64_t{G.computed + 1} * G.live();
    max_kv = std::max(max_kv, G.computed + 1);
  }
  if (kmax < 2) return 0;
  const uint64_t seqs = st.running_seqs;
  auto step_shape = [&](uint64_t k) {
    StepShape shape;
    shape.num_seqs = static_cast<uint32_t>(seqs);
    shape.new_tokens = seqs;
    shape.kv_read_tokens = kv_read + k * seqs;
    shape.attn_pairs = double(shape.kv_read_tokens);
    shape.decode_seqs = shape.num_seqs;
    shape.decode_kv_tokens = shape.kv_read_tokens;
    shape.decode_max_kv = max_kv + static_cast<uint32_t>(k);
    return shape;
  };
  // Steps needed to pass stop_at if none were longer than the first (steps grow with the KV
  // they read): only sequences crossing their capacity within them are queued. Should a later
  // step be shorter after all, the run ends at the cap and the next call goes on (a run may
  // end after any step: it equals its steps taken one by one).
  const SimTime first = model_.step_time(step_shape(0));
  uint64_t kcap = kmax;
  if (first > 0 && stop_at > clock_.now())
    kcap = std::min<uint64_t>(kmax, (stop_at - clock_.now() + first - 1) / first);
  // (step, position in running, sequence): the next grow each sequence needs.
  using Crossing = std::tuple<uint64_t, uint32_t, uint32_t>;
  std::priority_queue<Crossing, std::vector<Crossing>, std::greater<>> due;
  for (uint32_t i = 0; i < st.running.size(); ++i) {
    const Group& G = groups_[st.running[i]];
    for (uint32_t q = 0; q < G.live(); ++q) {
      const Sequence& s = G.seqs[q];
      if (s.capacity - G.computed < kcap) due.emplace(s.capacity - G.computed, i, q);
    }
  }
  uint64_t k = 0;
  bool blocked = false;
  for (; k < kcap && !blocked; ++k) {
    while (!due.empty() && std::get<0>(due.top()) == k) {
      const auto [j, i, q] = due.top();
      Group& G = groups_[st.running[i]];
      Sequence& s = G.seqs[q];
      const uint32_t target = G.computed + static_cast<uint32_t>(j) + 1;
      const SimTime kv0 = clock_.now();
      const Status grown = kv_->grow(s.id, s.content, target, 0);
      r_.kv_critical_time += clock_.now() - kv0;
      if (!grown.ok()) {
        if (grown.error().code != ErrorCode::kOutOfMemory)
          throw std::logic_error("KV manager rejected a grow: " + grown.error().message);
        blocked = true;  // the scheduler redoes this step and preempts
        break;
      }
      due.pop();
      s.kv_tokens = s.synced = target;
      s.capacity = kv_->seq_capacity(s.id);
      if (s.capacity - G.computed < kcap) due.emplace(s.capacity - G.computed, i, q);
    }
    if (blocked) break;
    const SimTime step = k == 0 ? first : model_.step_time(step_shape(k));
    clock_.advance(step);
    running_integral_ += double(seqs) * double(step);
    if (clock_.now() >= stop_at) {
      ++k;
      break;
    }
  }
  if (k == 0) return 0;
  r_.steps += k;
  r_.computed_tokens += k * seqs;
  r_.max_running_seqs = std::max(r_.max_running_seqs, st.running_seqs);
  bool any_finished = false;
  for (uint32_t g : st.running) {
    Group& G = groups_[g];
    G.computed += static_cast<uint32_t>(k);
    G.outputs += static_cast<uint32_t>(k);
    for (Sequence& s : G.seqs) s.kv_tokens = std::max(G.computed, s.synced);
    if (G.outputs >= G.spec.output_tokens) {
      complete_group(g);
      any_finished = true;
    }
  }
  if (any_finished) drop_finished();
  return k;
}

bool Engine::start() {
  r_.label = c_.label;
  r_.step_time_source = c_.measured_clock ? "measured" : model_.source();
  if (c_.measured_clock && !c_.executor) {
    r_.error = "measured_clock needs a step executor that times its steps";
    return false;
  }
  r_.kv_impl = c_.kv_impl;
  r_.scheduler = c_.scheduler;
  r_.requests = requests_.size();
  const SchedulerEntry* info = schedulers().find(c_.scheduler);
  if (!info) {
    r_.error = schedulers().unknown(c_.scheduler);
    return false;
  }
  scheduler_ = info->make();
  if (!set_batch_queue()) return false;
  kv_ = c_.kv_factory();
  KvInit init;
  const ModelShape& kv_model = c_.kv_model ? *c_.kv_model : c_.model;
  init.layers = kv_model.layers;
  init.kv_bytes_per_token = kv_model.kv_bytes_per_token();
  init.budget_bytes = c_.kv_budget_bytes;
  init.max_num_seqs = c_.serve.max_num_seqs;
  init.max_model_len = c_.serve.max_model_len;
  init.groups = kv_cache_groups(kv_model.layer_windows(), c_.hybrid_kv_cache);
  // Whether the run's step executor reads sliding-window groups (asked of a throwaway one).
  const bool blind = c_.executor && !c_.executor()->reads_kv_groups();
  if (r_.error = kv_groups_refusal(*kv_, init, blind); !r_.error.empty()) return false;
  if (c_.backend) {
    auto made = c_.backend(c_.gpu, clock_);
    if (!made.ok()) {
      r_.error = fmt::format("backend: {}", made.error().message);
      return false;
    }
    backend_ = std::move(made).value();
  } else {
    backend_ = std::make_unique<SimBackend>(c_.gpu, clock_);
  }
  if (Status s = kv_->init(*backend_, init); !s.ok()) {
    r_.error = fmt::format("KV cache init: {}", s.error().message);
    return false;
  }
  // The pinned swap space exists whenever a group can be swapped: in swap mode, and for requests
  // with several samples or beams, which are swapped whatever the mode (vLLM V0).
  const bool multi = feed_open_ ? any_parallel_ : requests_.any_parallel();
  if ((c_.serve.preemption == Preemption::kSwap || multi) && c_.serve.swap_space) {
    auto host = backend_->host_malloc_pinned(c_.serve.swap_space);
    if (!host.ok()) {
      r_.error = fmt::format("swap space: {}", host.error().message);
      return false;
    }
    swap_space_ = *host;
  }
  // Groups are added as their requests arrive; sequence ids past every request's.
  const size_t requests = feed_open_ ? capacity_ : requests_.size();
  next_seq_ = requests;
  latency_.reserve(requests);
  state_ = std::make_unique<ServeState>(*kv_, c_.serve, groups_);
  r_.kv_capacity_tokens = kv_->free_token_capacity();
  if (c_.executor) {
    executor_ = c_.executor();
    if (Status s = executor_->begin(*kv_, *backend_, swap_space_, c_.serve.swap_space); !s.ok()) {
      r_.error = fmt::format("step executor: {}", s.error().message);
      executor_.reset();
      (void)kv_->shutdown();
      return false;
    }
    r_.executed = true;
    validate_rng_.seed(c_.serve.seed ^ 0x76616c6964617465ull);
    state_->swap_hook = [this](const Sequence& s, SeqId source, uint32_t tokens,
                               ServeState::SwapEvent e) -> Status {
      switch (e) {
        case ServeState::SwapEvent::kOut:
          return executor_->swap_out(s.id, source, s.content, tokens);
        case ServeState::SwapEvent::kIn:
          return executor_->swap_in(s.id, s.content, tokens);
        case ServeState::SwapEvent::kDrop:
          return executor_->swap_drop(s.id);
      }
      return {};
    };
  }
  begin_loop();
  return true;
}

void Engine::begin_loop() {
  // Background KV work runs once per step, which the fast path (steps taken together) skips.
  fast_ = c_.fast_decode && !executor_ && !kv_->has_background() && depth_ == 1 &&
          scheduler_->allows_fast_decode();
  t0_ = last_sample_ = last_done_ = clock_.now();
  stage_free_.assign(c_.pipeline ? c_.pipeline->stages() : 1, t0_);
  next_sample_ = t0_;
  counts_.time = t0_;
}

void Engine::open_feed(size_t capacity, bool any_parallel) {
  feed_open_ = true;
  capacity_ = capacity;
  any_parallel_ = any_parallel;
}

void Engine::advance(SimTime until) {
  horizon_ = until;
  try {
    while (!stop_ && (feed_open_ || done_ < requests_.size()) && clock_.now() < horizon_)
      loop_step();
  } catch (const std::logic_error& e) {
    r_.error = e.what();
    stop_ = threw_ = true;
  }
}

void Engine::note_counts() {
  const RequestCounts now{state_->waiting.size() + state_->swapped.size(), state_->running.size()};
  if (now == counts_.now) return;
  counts_.before = counts_.now;
  counts_.before_time = counts_.time;
  counts_.now = now;
  counts_.time = clock_.now();
}

void Engine::loop_step() {
  StepPlan& plan = plan_;
  if (c_.progress && (++loops_ & 1023) == 0)
    c_.progress({done_, requests_.size(), clock_.now() - t0_});
  while (next_ < requests_.size() && t0_ + requests_.arrival(next_) <= clock_.now()) {
    const uint32_t g = static_cast<uint32_t>(next_++);
    add_group(g);
    if (groups_[g].spec.prompt_tokens >= c_.serve.max_model_len) {
      // vLLM refuses prompts that leave no room to generate.
      state_->reject(g, fmt::format("its prompt of {} tokens leaves no room to generate under "
                                    "max_model_len {}",
                                    groups_[g].spec.prompt_tokens, c_.serve.max_model_len));
      continue;
    }
    groups_[g].status = GroupStatus::kWaiting;
    state_->waiting.push_back(g);
  }
  const SimTime arrival = next_ < requests_.size() ? t0_ + requests_.arrival(next_) : INT64_MAX;
  const SimTime stop_at = std::min({next_sample_, arrival, horizon_});
  if (fast_ && fast_decode(stop_at) > 0) {
    note_counts();
    maybe_sample();
    return;
  }
  plan.clear();
  state_->step_swap_bytes = 0;
  const SimTime kv0 = clock_.now();  // the scheduler advances the clock only by KV calls
  const uint64_t preemptions0 = state_->counters().preemptions;
  const size_t ended0 = state_->finished_now.size();  // rejected on arrival
  state_->refusal = {};
  scheduler_->schedule(*state_, plan);
  r_.kv_critical_time += clock_.now() - kv0;
  const bool preempted = state_->counters().preemptions != preemptions0;
  const bool ended = state_->finished_now.size() > ended0;  // by the scheduler
  for (uint32_t g : state_->finished_now) finish(g);
  state_->finished_now.clear();
  if (!state_->hook_error.ok()) {
    r_.error = state_->hook_error.error().message;
    stop_ = true;
    return;
  }
  if (state_->step_swap_bytes) clock_.advance(model_.pcie_transfer(state_->step_swap_bytes));
  if (plan.groups.empty() && !in_flight_.empty()) {  // nothing new: the oldest step's output
    await_oldest();
    note_counts();
    maybe_sample();
    return;
  }
  if (plan.groups.empty()) {
    note_counts();
    if (!on_empty_plan(preempted, ended, next_)) {
      stop_ = true;
      return;
    }
    for (uint32_t g : state_->finished_now) finish(g);
    state_->finished_now.clear();
    return;
  }
  idle_retry_ = false;
  const StepShape shape = shape_of(plan);
  r_.computed_tokens += shape.new_tokens;
  if (depth_ > 1) {  // steps in flight (src/serve/engine_batch_queue.cpp)
    submit(plan, shape);
    note_counts();
    maybe_sample();
    return;
  }
  const SimTime exec0 = clock_.now();
  // The host clock at the step's issue, for measured runs only (not on the sim's hot path).
  const double wall0 =
      c_.measured_clock
          ? std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count()
          : 0.0;
  if (executor_) {
    if (Status s = execute(plan, shape); !s.ok()) {
      r_.error = s.error().message;
      stop_ = true;
      return;
    }
  }
  SimTime compute = model_.step_time(shape);
  if (c_.measured_clock) {
    // The step's backend calls already advanced the clock at their modelled cost; the rest
    // of the measured wall time is compute.
    const SimTime charged = clock_.now() - exec0;
    r_.measured_steps.push_back(
        {shape, compute, executor_->measured_step_ns(), wall0, executor_->measured_step_gpu_ms()});
    compute = std::max<SimTime>(0, executor_->measured_step_ns() - charged);
  }
  const SimTime start = clock_.now();
  run_step_time(plan, compute);
  const SimTime step = clock_.now() - start;
  ++r_.steps;
  running_integral_ += double(state_->running_seqs) * double(step);
  r_.max_running_seqs = std::max(r_.max_running_seqs, state_->running_seqs);
  const SimTime done0 = clock_.now();
  complete_step(plan);
  r_.kv_critical_time += clock_.now() - done0;
  note_counts();
  maybe_sample();
}

void Engine::maybe_sample() {
  if (clock_.now() < next_sample_) return;
  sample();
  next_sample_ = clock_.now() + c_.sample_interval;
}

void set_rate_figures(ServingResult& r, LatencySamples& latency, double running_integral,
                      double waste_integral) {
  r.ttft_ms = latency.ttft_ms();
  r.tpot_ms = latency.tpot_ms();
  r.e2e_ms = latency.e2e_ms();
  const double secs = double(r.sim_time) / 1e9;
  r.output_tokens_per_s = secs > 0 ? double(r.output_tokens) / secs : 0;
  r.requests_per_s = secs > 0 ? double(r.finished - r.rejected) / secs : 0;
  r.mean_running_seqs = r.sim_time ? running_integral / double(r.sim_time) : 0;
  r.waste_pct = r.sim_time ? waste_integral / double(r.sim_time) : 0;
  r.prefix_hit_rate = r.counters.prefix_query_tokens
                          ? double(r.counters.prefix_hit_tokens) / r.counters.prefix_query_tokens
                          : 0;
}

void Engine::report() {
  r_.sim_time = clock_.now() - t0_;
  r_.requests = requests_.size();

  std::string why;
  if (r_.error.empty() && !kv_->check_invariants(&why)) r_.error = why;
  r_.kv = kv_->stats();
  r_.counters = state_->counters();
  // Finished groups were recorded as they finished; a failed run leaves some in flight, and
  // some the scheduler ended that the engine did not finish.
  for (uint32_t g = groups_.begin_index(); g < groups_.end_index(); ++g)
    if (groups_[g].status != GroupStatus::kFinished) record(groups_[g]);
  for (uint32_t g : state_->finished_now) record(groups_[g]);
  for (size_t i = groups_.end_index(); i < requests_.size(); ++i) {  // never arrived (failed)
    const uint64_t prompt = requests_.prompt_tokens(i);
    if (prompt < c_.serve.max_model_len &&
        prompt + requests_.output_tokens(i) > c_.serve.max_model_len)
      ++length_capped_;
  }
  r_.rejected = r_.counters.rejected;
  r_.rejections = state_->rejections;
  r_.length_capped = length_capped_;
  set_rate_figures(r_, latency_, running_integral_, waste_integral_);

  if (executor_) {
    r_.validation = executor_->report();
    executor_->end();
  }
  // Everything must come back: live sequences are released, then the pool itself.
  if (r_.error.empty() && done_ == requests_.size() &&
      (r_.kv.slots_allocated || r_.kv.tokens_stored))
    r_.error =
        fmt::format("{} KV slots still allocated after the last request", r_.kv.slots_allocated);
  if (Status s = kv_->shutdown(); !s.ok() && r_.error.empty()) r_.error = s.error().message;
  if (swap_space_) (void)backend_->host_free_pinned(swap_space_);
  if (r_.error.empty() && backend_->usage().physical_bytes != 0)
    r_.error =
        fmt::format("{} device bytes still held after shutdown", backend_->usage().physical_bytes);
  r_.samples = metrics_.take_samples();
  for (size_t i = 0; i < metrics_.series_count(); ++i)
    r_.series.push_back(metrics_.name(static_cast<MetricsRecorder::SeriesId>(i)));
}

ServingResult Engine::run() {
  if (!start()) return std::move(r_);
  const auto wall0 = std::chrono::steady_clock::now();
  advance(INT64_MAX);
  r_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return finish();
}

ServingResult Engine::finish() {
  if (!threw_) sample();
  report();
  return std::move(r_);  // the samples are large: no copy
}

ServingResult run_serving(const EngineConfig& config, const RequestTable& requests) {
  Engine engine(config, requests);
  return engine.run();
}

ServingResult run_serving(const EngineConfig& config, const std::vector<RequestSpec>& requests) {
  return run_serving(config, RequestTable(requests));
}

}  // namespace memsim
