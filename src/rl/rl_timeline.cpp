// The RL co-location timeline (see rl_timeline.h): the phases of each iteration, the trainer's
// programs through a caching allocator, and memory by tag, per phase, on the sim backend (the
// rollout engine's side: rl_engine.cpp).
#include "src/rl/rl_timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "backends/sim/sim_backend.h"
#include "core/parallel.h"
#include "src/rl/rl_timeline_impl.h"

namespace memsim {

const char* to_string(RlTag t) {
  switch (t) {
    case RlTag::kWeights:
      return "rollout.weights";
    case RlTag::kKvCache:
      return "rollout.kv_cache";
    case RlTag::kCudaGraph:
      return "rollout.cuda_graph";
    case RlTag::kRolloutActivations:
      return "rollout.activations";
    case RlTag::kRolloutComm:
      return "rollout.comm";
    case RlTag::kParams:
      return "train.params";
    case RlTag::kGrads:
      return "train.grads";
    case RlTag::kOptimizer:
      return "train.optimizer";
    case RlTag::kActivations:
      return "train.activations";
    case RlTag::kLogits:
      return "train.logits";
    case RlTag::kComm:
      return "train.comm";
    case RlTag::kReference:
      return "train.reference";
    case RlTag::kAllocatorCache:
      return "allocator_cache";
    case RlTag::kCount:
      break;
  }
  return "?";
}

const char* to_string(RlTeardown::WeightsTo w) {
  return w == RlTeardown::WeightsTo::kDisk ? "disk" : "host";
}

namespace rl_detail {

namespace {

RlTag rl_tag(TrainTag t) {
  switch (t) {
    case TrainTag::kParams:
      return RlTag::kParams;
    case TrainTag::kGrads:
      return RlTag::kGrads;
    case TrainTag::kOptimizer:
      return RlTag::kOptimizer;
    case TrainTag::kActivations:
      return RlTag::kActivations;
    case TrainTag::kLogits:
      return RlTag::kLogits;
    case TrainTag::kComm:
      return RlTag::kComm;
    case TrainTag::kReference:
      return RlTag::kReference;
  }
  return RlTag::kActivations;
}

}  // namespace

RlTag rollout_tag(const std::string& tag) {
  if (tag == "weights") return RlTag::kWeights;
  if (tag == "kv_cache") return RlTag::kKvCache;
  return RlTag::kCudaGraph;
}

std::string gib(uint64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1ull << 30));
}

constexpr size_t kSamplesPerPhase = 400;  // kept per phase (peaks preserved)

Timeline::Timeline(const RlConfig& c, const ModelShape& m, const RlRunSpec& run,
                   const RolloutPlan& plan, const RlRunHooks& hooks)
    : c_(c),
      m_(m),
      run_(run),
      plan_(plan),
      hooks_(hooks),
      builder_(m, train_spec(c, plan), c.reference) {
  r_.label = run.label;
  r_.model = m.name;
  r_.placement = run.placement == RlPlacement::kSeparate ? "separate" : "colocated";
  r_.saver = run.saver.empty() ? "none" : run.saver;
  if (run.teardown) r_.saver = fmt::format("teardown:{}", to_string(run.teardown->weights_to));
  r_.gpus = run.placement == RlPlacement::kSeparate ? 2 : 1;
}

RlRunResult Timeline::run() {
  r_.kv_bytes = plan_.budget.kv_bytes;
  r_.kv_tokens = plan_.budget.kv_tokens;
  r_.weights_bytes = plan_.budget.weights;
  r_.graph_bytes = plan_.budget.graph_memory;
  r_.rollout_tp = plan_.budget.tensor_parallel;
  r_.rollout_comm_bytes = plan_.budget.comm.total();
  try {
    setup_devices();
    init();
    for (uint32_t i = 0; i < c_.iterations; ++i) {
      iteration(i);
      r_.iterations_done = i + 1;
    }
    end_phase();
    teardown();
  } catch (const OutOfMemory& e) {
    r_.oom = e.what;
    r_.oom_bytes_short = e.bytes_short;
    close_after_failure();
  } catch (const RunFailure& e) {
    r_.error = e.what;
    close_after_failure();
  }
  summarize();
  return std::move(r_);
}

TrainSpec Timeline::train_spec(const RlConfig& c, const RolloutPlan& plan) {
  TrainSpec s = c.train;
  if (plan.mean_sequence_tokens > 0) s.sequence_tokens = plan.mean_sequence_tokens;
  return s;
}

void Timeline::setup_devices() {
  devices_.resize(run_.placement == RlPlacement::kSeparate ? 2 : 1);
  for (Device& d : devices_) {
    if (hooks_.backend) {
      auto made = hooks_.backend(c_.gpu, clock_);
      if (!made.ok()) throw RunFailure{"backend: " + made.error().message};
      d.backend = std::move(made).value();
    } else {
      d.backend = std::make_unique<SimBackend>(c_.gpu, clock_);
    }
    d.train_alloc = c_.allocator(*d.backend);
    d.rollout_alloc = c_.allocator(*d.backend);
  }
  if (run_.saver_factory) saver_ = run_.saver_factory(*rollout_gpu().backend);
}

// ---- phases and samples ---------------------------------------------------------------------
void Timeline::begin_phase(uint32_t iteration, std::string name) {
  end_phase();
  RlPhase p;
  p.iteration = iteration;
  p.name = std::move(name);
  p.start = clock_.now();
  r_.phases.push_back(std::move(p));
  phase_first_sample_ = r_.samples.size();
  sample_all();
}

void Timeline::end_phase() {
  if (r_.phases.empty() || phase_closed_) return;
  sample_all();
  RlPhase& p = r_.phases.back();
  p.end = clock_.now();
  thin_samples();
  phase_closed_ = true;
  if (hooks_.phase_end)
    hooks_.phase_end(*devices_[0].backend, p, devices_[0].backend->usage().physical_bytes);
}

// After a failed call: the gauges catch up with what the saver holds, the phase closes.
void Timeline::close_after_failure() {
  try {
    if (!devices_.empty()) refresh_saver_gauges();
    end_phase();
  } catch (const RunFailure& e) {
    if (r_.error.empty()) r_.error = e.what;
  }
}

void Timeline::sample_all() {
  for (size_t g = 0; g < devices_.size(); ++g) sample(g);
}

void Timeline::sample(size_t g) {
  if (r_.phases.empty()) return;
  phase_closed_ = false;
  Device& d = devices_[g];
  RlSample s;
  s.t = clock_.now();
  s.gpu = static_cast<uint8_t>(g);
  s.phase = static_cast<uint16_t>(r_.phases.size() - 1);
  s.bytes = d.bytes;
  const uint64_t reserved =
      d.train_alloc->stats().reserved_bytes + d.rollout_alloc->stats().reserved_bytes;
  s.bytes[static_cast<size_t>(RlTag::kAllocatorCache)] = reserved - d.allocator_live;
  s.physical = d.backend->usage().physical_bytes;
  uint64_t sum = 0;
  for (uint64_t b : s.bytes) sum += b;
  if (sum != s.physical)
    throw RunFailure{
        fmt::format("accounting: tags sum to {} bytes, the backend holds {}", sum, s.physical)};
  RlPhase& p = r_.phases.back();
  if (runs_on(p.name, g)) p.peak = std::max(p.peak, s.physical);
  if (g == 0) r_.peak_train_gpu = std::max(r_.peak_train_gpu, s.physical);
  if (g + 1 == devices_.size()) r_.peak_rollout_gpu = std::max(r_.peak_rollout_gpu, s.physical);
  r_.peak_pinned = std::max(r_.peak_pinned, d.backend->usage().pinned_host_bytes);
  r_.samples.push_back(s);
}

// Whether phase `name` works on GPU `g`: the one shared GPU, or with separate GPUs the rollout
// GPU for the rollout and the trainer's GPU for scoring and training (init and sync use both).
bool Timeline::runs_on(const std::string& name, size_t g) const {
  if (devices_.size() == 1 || name == "init" || name == "sync") return true;
  const bool rollout = name == "rollout" || name == "release" || name == "resume";
  return rollout == (g == rollout_index());
}

// Keeps at most kSamplesPerPhase samples of the phase per GPU: the first, the last and, per
// stretch, the one with the most device bytes.
void Timeline::thin_samples() {
  const size_t first = phase_first_sample_;
  const size_t n = r_.samples.size() - first;
  if (n <= kSamplesPerPhase * devices_.size()) return;
  std::vector<RlSample> kept;
  for (size_t g = 0; g < devices_.size(); ++g) {
    std::vector<RlSample> mine;
    for (size_t i = first; i < r_.samples.size(); ++i)
      if (r_.samples[i].gpu == g) mine.push_back(r_.samples[i]);
    if (mine.size() <= kSamplesPerPhase) {
      kept.insert(kept.end(), mine.begin(), mine.end());
      continue;
    }
    const size_t stretch = (mine.size() + kSamplesPerPhase - 3) / (kSamplesPerPhase - 2);
    kept.push_back(mine.front());
    for (size_t i = 1; i + 1 < mine.size(); i += stretch) {
      size_t best = i;
      for (size_t j = i; j < std::min(i + stretch, mine.size() - 1); ++j)
        if (mine[j].physical > mine[best].physical) best = j;
      kept.push_back(mine[best]);
    }
    kept.push_back(mine.back());
  }
  std::stable_sort(kept.begin(), kept.end(),
                   [](const RlSample& a, const RlSample& b) { return a.t < b.t; });
  r_.samples.resize(first);
  r_.samples.insert(r_.samples.end(), kept.begin(), kept.end());
}

// Bytes of tag `t` on GPU `g` change by `delta`: blocks of a caching allocator (the default)
// or memory the saver holds.
void Timeline::add(size_t g, RlTag t, int64_t delta, bool allocator_block) {
  devices_[g].bytes[static_cast<size_t>(t)] += static_cast<uint64_t>(delta);
  if (allocator_block) devices_[g].allocator_live += static_cast<uint64_t>(delta);
}

void Timeline::exec(const std::vector<TrainOp>& ops, const std::string& what) {
  Device& d = train_gpu();
  for (const TrainOp& op : ops) {
    switch (op.kind) {
      case TrainOp::Kind::kAlloc: {
        Result<DevPtr> p = d.train_alloc->malloc(op.bytes, StreamId{});
        if (!p.ok())
          fail(p.error(), fmt::format("{}: {} of {}", what, to_string(op.tag), gib(op.bytes)));
        live_[op.id] = {*p, op.bytes, rl_tag(op.tag)};
        add(0, rl_tag(op.tag), static_cast<int64_t>(op.bytes));
        sample(0);
        break;
      }
      case TrainOp::Kind::kFree: {
        auto it = live_.find(op.id);
        if (it == live_.end()) throw RunFailure{fmt::format("{}: free of unknown tensor", what)};
        check(d.train_alloc->free(it->second.ptr), what);
        add(0, it->second.tag, -static_cast<int64_t>(it->second.bytes));
        live_.erase(it);
        sample(0);
        break;
      }
      case TrainOp::Kind::kCompute:
        advance_s(op.flops / (c_.gpu.compute.peak_flops * c_.gpu.compute.flops_efficiency));
        break;
      case TrainOp::Kind::kComm:
        advance_s(static_cast<double>(op.bytes) / c_.interconnect_bytes_per_s);
        break;
      case TrainOp::Kind::kMemory:
        advance_s(static_cast<double>(op.bytes) /
                  (c_.gpu.compute.hbm_bytes_per_s * c_.gpu.compute.bandwidth_efficiency));
        break;
      case TrainOp::Kind::kToHost: {
        // A pinned buffer per offloaded tensor, allocated at the first offload and kept for
        // the next ones (pinning costs ~2.8 GB/s on the H200; copies run at PCIe speed).
        auto it = host_.find(op.slot);
        if (it == host_.end()) {
          Result<DevPtr> h = d.backend->host_malloc_pinned(op.bytes);
          if (!h.ok()) fail(h.error(), what);
          it = host_.emplace(op.slot, *h).first;
        }
        check(d.backend->copy(it->second, live_.at(op.id).ptr, op.bytes, StreamId{}), what);
        sample(0);
        break;
      }
      case TrainOp::Kind::kFromHost: {
        auto it = host_.find(op.slot);
        if (it == host_.end()) throw RunFailure{fmt::format("{}: no host copy to load", what)};
        check(d.backend->copy(live_.at(op.id).ptr, it->second, op.bytes, StreamId{}), what);
        break;
      }
      case TrainOp::Kind::kDeliver:
        deliver(live_.at(op.id).ptr, op.bytes, what);
        break;
    }
  }
}

// ---- the timeline ---------------------------------------------------------------------------
void Timeline::init() {
  begin_phase(0, "init");
  // veRL builds the actor (and reference) first, offloads what it is told to, then the
  // rollout engine, which sizes its KV cache from the whole GPU.
  exec(builder_.load_params(false), "trainer init");
  exec(builder_.load_optimizer(false), "trainer init");
  if (run_.placement == RlPlacement::kColocated) {
    if (run_.offload_params) exec(builder_.unload_params(true), "trainer init: offload");
    if (run_.offload_optimizer) exec(builder_.unload_optimizer(true), "trainer init: offload");
    check(train_gpu().train_alloc->empty_cache(), "empty_cache");
    sample(0);
  }
  init_rollout_engine();
}

void Timeline::iteration(uint32_t i) {
  const SimTime t_iter = clock_.now();
  rollout_phase(i);
  // Release: the engine gives its memory back (SGLang release_memory_occupation / vLLM sleep,
  // or the baseline's teardown), then empties its allocator's cache.
  const SimTime t_train = clock_.now();
  if (run_.placement == RlPlacement::kColocated) {
    if (saver_) release(i);
    if (run_.teardown) teardown_engine(i);
  }
  train_phases(i);
  train_s_ += static_cast<double>(clock_.now() - t_train) / 1e9;
  const SimTime t_sync = clock_.now();
  sync_phases(i);
  sync_s_ += static_cast<double>(clock_.now() - t_sync) / 1e9;
  iteration_s_ += static_cast<double>(clock_.now() - t_iter) / 1e9;
}

// Rollout: replay the captured decode graph (it must still be valid), generate.
void Timeline::rollout_phase(uint32_t i) {
  begin_phase(i, "rollout");
  const SimTime t_roll = clock_.now();
  launch_decode_graph();
  Device& rd = rollout_gpu();
  const RolloutIteration& ri = plan_.iterations[i];
  if (plan_.budget.activation_peak > 0) {
    Result<DevPtr> act = rd.rollout_alloc->malloc(plan_.budget.activation_peak, StreamId{});
    if (!act.ok())
      fail(act.error(),
           fmt::format("rollout: activations of {}", gib(plan_.budget.activation_peak)));
    add(rollout_index(), RlTag::kRolloutActivations,
        static_cast<int64_t>(plan_.budget.activation_peak));
    sample(rollout_index());
    clock_.advance(ri.duration);
    check(rd.rollout_alloc->free(*act), "rollout");
    add(rollout_index(), RlTag::kRolloutActivations,
        -static_cast<int64_t>(plan_.budget.activation_peak));
  } else {
    clock_.advance(ri.duration);
  }
  sample(rollout_index());
  r_.preemptions += ri.preemptions;
  rollout_s_ += static_cast<double>(clock_.now() - t_roll) / 1e9;
  rollout_tokens_ += ri.output_tokens;
}

// Trainer: reload, score, train, offload the optimizer.
void Timeline::train_phases(uint32_t i) {
  const bool colocated = run_.placement == RlPlacement::kColocated;
  const bool offload_p = colocated && run_.offload_params;
  const bool offload_o = colocated && run_.offload_optimizer;
  const RolloutIteration& ri = plan_.iterations[i];
  begin_phase(i, "score");
  const SimTime t_reload = clock_.now();
  if (offload_p) exec(builder_.load_params(true), "reload parameters");
  if (offload_o) exec(builder_.load_optimizer(true), "reload optimizer");
  reload_ms_ += static_cast<double>(clock_.now() - t_reload) / 1e6;
  if (c_.old_log_prob) exec(builder_.score(ri.train_tokens), "old log-probabilities");
  if (c_.reference) exec(builder_.score(ri.train_tokens), "reference log-probabilities");
  begin_phase(i, "train");
  const uint64_t per_step = (ri.train_tokens + c_.optimizer_steps - 1) / c_.optimizer_steps;
  for (uint32_t s = 0; s < c_.optimizer_steps; ++s) {
    const uint64_t tokens =
        std::min<uint64_t>(per_step, ri.train_tokens - std::min(ri.train_tokens, s * per_step));
    if (tokens > 0) exec(builder_.train_step(tokens), "train step");
  }
  if (offload_o) {
    begin_phase(i, "offload");
    const SimTime t0 = clock_.now();
    exec(builder_.unload_optimizer(true), "offload optimizer");
    check(train_gpu().train_alloc->empty_cache(), "empty_cache");
    sample(0);
    offload_ms_ += static_cast<double>(clock_.now() - t0) / 1e6;
  }
}

// Weight sync: wake the weights (multi-stage) or everything, update them bucket by bucket,
// drop the trainer's parameters, then wake the rest. The baseline instead writes the weights
// to host (and disk) and builds the engine again once the trainer is offloaded.
void Timeline::sync_phases(uint32_t i) {
  const bool colocated = run_.placement == RlPlacement::kColocated;
  begin_phase(i, "sync");
  if (colocated && saver_) {
    const std::vector<std::string> first =
        run_.multi_stage ? std::vector<std::string>{"weights"} : run_.saver_tags;
    resume_weights_ms_ += resume_stage(first, "resume (stage 1)", &measured_.resume_weights_ms,
                                       &resumed_weights_bytes_, &r_.resumes_weights);
  }
  sync_tensor_ = sync_offset_ = 0;
  exec(builder_.weight_sync(c_.sync_bucket_bytes), "weight sync");
  if (run_.teardown && run_.teardown->weights_to == RlTeardown::WeightsTo::kDisk) {
    const SimTime t0 = clock_.now();
    advance_s(static_cast<double>(plan_.budget.weights) / run_.teardown->disk_bytes_per_s);
    weights_out_ms_ += static_cast<double>(clock_.now() - t0) / 1e6;
  }
  if (colocated && run_.offload_params) {
    const SimTime t0 = clock_.now();
    exec(builder_.unload_params(true), "offload parameters");
    check(train_gpu().train_alloc->empty_cache(), "empty_cache");
    sample(0);
    offload_ms_ += static_cast<double>(clock_.now() - t0) / 1e6;
  }
  if (colocated && saver_ && run_.multi_stage) {
    begin_phase(i, "resume");
    resume_rest_ms_ +=
        resume_stage(saver_tags_except({"weights"}), "resume (stage 2)", &measured_.resume_rest_ms,
                     &resumed_rest_bytes_, &r_.resumes_rest);
  }
  if (colocated && run_.teardown) rebuild_engine(i);
}

void Timeline::teardown() {
  for (Device& d : devices_) {
    check(d.train_alloc->release_all(), "teardown");
    check(d.rollout_alloc->release_all(), "teardown");
  }
  if (saver_) check(saver_->release_all(), "teardown");
  for (const auto& [slot, h] : host_) check(train_gpu().backend->host_free_pinned(h), "teardown");
  for (DevPtr h : weights_host_) check(rollout_gpu().backend->host_free_pinned(h), "teardown");
  if (comm_) check(rollout_gpu().backend->device_free(comm_), "teardown");
  for (Device& d : devices_) {
    const Usage u = d.backend->usage();
    if (u.physical_bytes != 0 || u.pinned_host_bytes != 0)
      throw RunFailure{fmt::format("teardown leaves {} device and {} pinned bytes",
                                   u.physical_bytes, u.pinned_host_bytes)};
    std::string why;
    if (auto* sim = dynamic_cast<SimBackend*>(d.backend.get()))
      if (!sim->check_invariants(&why)) throw RunFailure{"backend invariant: " + why};
    if (hooks_.after_teardown) hooks_.after_teardown(*d.backend);
  }
}

void Timeline::summarize() {
  for (const RlPhase& p : r_.phases) {
    r_.peak = std::max(r_.peak, p.peak);
    uint64_t& v = r_.phase_peak[p.name];
    v = std::max(v, p.peak);
  }
  const double n = std::max<uint32_t>(1, r_.iterations_done);
  r_.rollout_s = rollout_s_ / n;
  r_.train_s = train_s_ / n;
  r_.sync_s = sync_s_ / n;
  r_.iteration_s = iteration_s_ / n;
  r_.pause_ms = pause_ms_ / n;
  r_.resume_weights_ms = resume_weights_ms_ / n;
  r_.resume_rest_ms = resume_rest_ms_ / n;
  r_.offload_ms = offload_ms_ / n;
  r_.weights_out_ms = weights_out_ms_ / n;
  r_.recapture_ms = recapture_ms_ / n;
  r_.weights_out_bytes = static_cast<uint64_t>(static_cast<double>(weights_out_bytes_) / n);
  r_.weights_in_bytes = static_cast<uint64_t>(static_cast<double>(weights_in_bytes_) / n);
  r_.reload_ms = reload_ms_ / n;
  for (const auto& [k, ms] : pause_split_) r_.pause_split_ms[k] = ms / n;
  for (const auto& [k, ms] : resume_split_) r_.resume_split_ms[k] = ms / n;
  r_.measured.pause_ms = measured_.pause_ms / n;
  r_.measured.resume_weights_ms = measured_.resume_weights_ms / n;
  r_.measured.resume_rest_ms = measured_.resume_rest_ms / n;
  r_.rollout_tokens_per_s = rollout_s_ > 0 ? static_cast<double>(rollout_tokens_) / rollout_s_ : 0;
  auto mean = [](uint64_t sum, uint32_t calls) { return calls == 0 ? 0 : sum / calls; };
  r_.pause_freed_bytes = mean(freed_bytes_, r_.pauses);
  r_.resume_weights_bytes = mean(resumed_weights_bytes_, r_.resumes_weights);
  r_.resume_rest_bytes = mean(resumed_rest_bytes_, r_.resumes_rest);
}

// ---- helpers --------------------------------------------------------------------------------
void Timeline::advance_s(double seconds) {
  clock_.advance(static_cast<SimTime>(std::llround(seconds * 1e9)));
}

void Timeline::fail(const Error& e, const std::string& what) {
  const std::string where = r_.phases.empty()
                                ? what
                                : fmt::format("iteration {}, {}: {}", r_.phases.back().iteration,
                                              r_.phases.back().name, what);
  if (e.code == ErrorCode::kOutOfMemory)
    throw OutOfMemory{fmt::format("{} ({} short)", where, gib(e.bytes_short)), e.bytes_short};
  throw RunFailure{where + ": " + e.message};
}

void Timeline::check(const Status& s, const std::string& what) {
  if (!s.ok()) fail(s.error(), what);
}

}  // namespace rl_detail

RlRunResult run_rl_one(const RlConfig& config, const ModelShape& model, const RlRunSpec& run) {
  const RolloutPlan plan = plan_rollout(config, model, run);
  return run_rl_with_plan(config, model, run, plan);
}

RlRunResult run_rl_with_plan(const RlConfig& config, const ModelShape& model, const RlRunSpec& run,
                             const RolloutPlan& plan, const RlRunHooks& hooks) {
  if (!plan.error.empty()) {
    RlRunResult r;
    r.label = run.label;
    r.model = model.name;
    r.placement = run.placement == RlPlacement::kSeparate ? "separate" : "colocated";
    r.saver = run.saver.empty() ? "none" : run.saver;
    r.error = plan.error;
    return r;
  }
  return rl_detail::Timeline(config, model, run, plan, hooks).run();
}

RlResults run_rl(const RlConfig& config) {
  RlResults out;
  const auto wall0 = std::chrono::steady_clock::now();
  struct Job {
    const ModelShape* model;
    const RlRunSpec* run;
  };
  std::vector<Job> jobs;
  for (const ModelShape& m : config.models)
    for (const RlRunSpec& r : config.runs) jobs.push_back({&m, &r});
  // Rollout plans (budget and serving runs) are shared by runs with the same engine settings.
  std::vector<std::shared_ptr<const RolloutPlan>> plans(jobs.size());
  std::map<std::string, std::shared_ptr<const RolloutPlan>> cache;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const std::string key = rollout_plan_key(config, *jobs[i].model, *jobs[i].run);
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache
               .emplace(key, std::make_shared<const RolloutPlan>(
                                 plan_rollout(config, *jobs[i].model, *jobs[i].run)))
               .first;
    plans[i] = it->second;
  }
  out.runs.resize(jobs.size());
  parallel_for(jobs.size(), 0, [&](size_t i) {
    out.runs[i] = run_rl_with_plan(config, *jobs[i].model, *jobs[i].run, *plans[i]);
    if (config.max_utilization)
      out.runs[i].max_utilization = max_rollout_utilization(config, *jobs[i].model, *jobs[i].run);
  });
  out.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return out;
}

}  // namespace memsim
