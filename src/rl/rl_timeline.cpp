// The RL co-location timeline (see rl_timeline.h): drives the rollout engine's memory through a
// memory saver (or none), the trainer's programs through a caching allocator, and records memory
// by tag, per phase, on the sim backend.
#include "src/rl/rl_timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <unordered_map>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "core/parallel.h"
#include "src/rl/rl_rollout.h"

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

RlTag rollout_tag(const std::string& tag) {
  if (tag == "weights") return RlTag::kWeights;
  if (tag == "kv_cache") return RlTag::kKvCache;
  return RlTag::kCudaGraph;
}

// Out of memory: ends the run as an outcome.
struct OutOfMemory {
  std::string what;
  uint64_t bytes_short = 0;
};
// Anything else that fails: ends the run as an error.
struct RunFailure {
  std::string what;
};

std::string gib(uint64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1ull << 30));
}

constexpr size_t kSamplesPerPhase = 400;  // kept per phase (peaks preserved)

// One GPU: its backend and the two processes' caching allocators.
struct Device {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<CachingAllocator> train_alloc;    // the trainer process
  std::unique_ptr<CachingAllocator> rollout_alloc;  // the rollout engine's process
  std::array<uint64_t, kRlTagCount> bytes{};        // without kAllocatorCache
  uint64_t allocator_live = 0;                      // of those, blocks of the allocators
};

class Timeline {
 public:
  Timeline(const RlConfig& c, const ModelShape& m, const RlRunSpec& run, const RolloutPlan& plan,
           const RlRunHooks& hooks)
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
    r_.gpus = run.placement == RlPlacement::kSeparate ? 2 : 1;
  }

  RlRunResult run() {
    r_.kv_bytes = plan_.budget.kv_bytes;
    r_.kv_tokens = plan_.budget.kv_tokens;
    r_.weights_bytes = plan_.budget.weights;
    r_.graph_bytes = plan_.budget.graph_memory;
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

 private:
  static TrainSpec train_spec(const RlConfig& c, const RolloutPlan& plan) {
    TrainSpec s = c.train;
    if (plan.mean_sequence_tokens > 0) s.sequence_tokens = plan.mean_sequence_tokens;
    return s;
  }

  Device& train_gpu() { return devices_[0]; }
  Device& rollout_gpu() { return devices_.back(); }

  void setup_devices() {
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

  void begin_phase(uint32_t iteration, std::string name) {
    end_phase();
    RlPhase p;
    p.iteration = iteration;
    p.name = std::move(name);
    p.start = clock_.now();
    r_.phases.push_back(std::move(p));
    phase_first_sample_ = r_.samples.size();
    sample_all();
  }

  void end_phase() {
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
  void close_after_failure() {
    try {
      if (!devices_.empty()) refresh_saver_gauges();
      end_phase();
    } catch (const RunFailure& e) {
      if (r_.error.empty()) r_.error = e.what;
    }
  }

  void sample_all() {
    for (size_t g = 0; g < devices_.size(); ++g) sample(g);
  }

  void sample(size_t g) {
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
  bool runs_on(const std::string& name, size_t g) const {
    if (devices_.size() == 1 || name == "init" || name == "sync") return true;
    const bool rollout = name == "rollout" || name == "release" || name == "resume";
    return rollout == (g == rollout_index());
  }

  // Keeps at most kSamplesPerPhase samples of the phase per GPU: the first, the last and, per
  // stretch, the one with the most device bytes.
  void thin_samples() {
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
  void add(size_t g, RlTag t, int64_t delta, bool allocator_block = true) {
    devices_[g].bytes[static_cast<size_t>(t)] += static_cast<uint64_t>(delta);
    if (allocator_block) devices_[g].allocator_live += static_cast<uint64_t>(delta);
  }

  // ---- the rollout engine -----------------------------------------------------------------------

  bool via_saver(const std::string& tag) const {
    return saver_ &&
           std::find(run_.saver_tags.begin(), run_.saver_tags.end(), tag) != run_.saver_tags.end();
  }

  size_t rollout_index() const { return devices_.size() - 1; }

  // A tensor of the engine: from the saver for its tags, else from the engine process's caching
  // allocator (PyTorch tensors, the graph pool's segments).
  DevPtr engine_alloc(uint64_t bytes, const std::string& tag) {
    Result<DevPtr> p = via_saver(tag) ? saver_->malloc(bytes, tag)
                                      : rollout_gpu().rollout_alloc->malloc(bytes, StreamId{});
    if (!p.ok()) fail(p.error(), fmt::format("rollout engine init: {} ({} bytes)", tag, bytes));
    if (!via_saver(tag)) add(rollout_index(), rollout_tag(tag), static_cast<int64_t>(bytes));
    return *p;
  }

  // The saver's tags' physical bytes into the gauges (after any saver call).
  void refresh_saver_gauges() {
    if (!saver_) return;
    const SaverStats st = saver_->stats();
    for (const std::string& tag :
         {std::string("weights"), std::string("kv_cache"), std::string("cuda_graph")}) {
      if (!via_saver(tag)) continue;
      auto it = st.tags.find(tag);
      rollout_gpu().bytes[static_cast<size_t>(rollout_tag(tag))] =
          it == st.tags.end() ? 0 : it->second.active_bytes;
    }
    sample(rollout_index());
  }

  void init_rollout_engine() {
    // Weights as vLLM's fused parameters, the KV cache one tensor per layer, the graph pool.
    // What each holds on the device is read back from the gauges (see weights_reserved_bytes).
    const auto held = [&](RlTag t) { return rollout_gpu().bytes[static_cast<size_t>(t)]; };
    for (uint64_t bytes : plan_.weight_tensors)
      weights_.push_back({engine_alloc(bytes, "weights"), bytes});
    refresh_saver_gauges();
    r_.weights_reserved_bytes = held(RlTag::kWeights);
    for (uint32_t l = 0; l < m_.layers; ++l)
      kv_.push_back({engine_alloc(plan_.kv_layer_bytes, "kv_cache"), plan_.kv_layer_bytes});
    refresh_saver_gauges();
    r_.kv_reserved_bytes = held(RlTag::kKvCache);
    if (plan_.budget.graph_memory > 0) {
      graph_pool_ = {engine_alloc(plan_.budget.graph_memory, "cuda_graph"),
                     plan_.budget.graph_memory};
      refresh_saver_gauges();
      r_.graph_reserved_bytes = held(RlTag::kCudaGraph);
    }
    // A decode graph reading every weight and writing every layer's KV and the graph pool: its
    // replays after each resume tell whether the addresses it captured are still mapped.
    Backend& b = *rollout_gpu().backend;
    auto stream = b.create_stream();
    if (!stream.ok()) fail(stream.error(), "create stream");
    stream_ = *stream;
    check(b.begin_capture(stream_), "begin capture");
    for (const auto& [p, bytes] : weights_) check(b.fill(p, bytes, 0, stream_), "capture");
    for (const auto& [p, bytes] : kv_) check(b.fill(p, bytes, 0, stream_), "capture");
    if (graph_pool_.first)
      check(b.fill(graph_pool_.first, graph_pool_.second, 0, stream_), "capture");
    auto g = b.end_capture(stream_);
    if (!g.ok()) fail(g.error(), "end capture");
    graph_ = *g;
    sample(rollout_index());
  }

  void launch_decode_graph() {
    const Status s = rollout_gpu().backend->launch(graph_, stream_);
    ++r_.graph_launches;
    if (!s.ok() && r_.graphs_valid) {
      r_.graphs_valid = false;
      r_.graph_error = s.error().message;
    }
  }

  // ---- trainer programs ---------------------------------------------------------------------

  struct Live {
    DevPtr ptr = 0;
    uint64_t bytes = 0;
    RlTag tag;
  };

  void exec(const std::vector<TrainOp>& ops, const std::string& what) {
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

  // Copies a bucket of gathered parameters into the rollout engine's weights (in order; the
  // bucket sizes follow the trainer's units, the copies the engine's tensors).
  void deliver(DevPtr src, uint64_t bytes, const std::string& what) {
    Backend& rb = *rollout_gpu().backend;
    if (run_.placement == RlPlacement::kSeparate) {
      // Broadcast to the rollout GPU into a receive buffer of the engine's process.
      advance_s(static_cast<double>(bytes) / c_.network_bytes_per_s);
      Result<DevPtr> recv = rollout_gpu().rollout_alloc->malloc(bytes, StreamId{});
      if (!recv.ok()) fail(recv.error(), what + ": receive buffer");
      add(1, RlTag::kComm, static_cast<int64_t>(bytes));
      sample(1);
      src = *recv;
      copy_into_weights(rb, src, bytes, what);
      check(rollout_gpu().rollout_alloc->free(*recv), what);
      add(1, RlTag::kComm, -static_cast<int64_t>(bytes));
      sample(1);
      return;
    }
    copy_into_weights(rb, src, bytes, what);
  }

  void copy_into_weights(Backend& b, DevPtr src, uint64_t bytes, const std::string& what) {
    uint64_t done = 0;
    while (done < bytes && sync_tensor_ < weights_.size()) {
      const auto& [dst, size] = weights_[sync_tensor_];
      const uint64_t n = std::min(bytes - done, size - sync_offset_);
      check(b.copy(dst + sync_offset_, src + done, n, StreamId{}), what + ": weight update");
      done += n;
      sync_offset_ += n;
      if (sync_offset_ == size) {
        ++sync_tensor_;
        sync_offset_ = 0;
      }
    }
  }

  // ---- saver ----------------------------------------------------------------------------------

  std::vector<std::string> saver_tags_except(const std::vector<std::string>& skip) const {
    std::vector<std::string> out;
    for (const std::string& t : run_.saver_tags)
      if (std::find(skip.begin(), skip.end(), t) == skip.end()) out.push_back(t);
    return out;
  }

  // Pauses or resumes `tags`; returns the simulated milliseconds and adds the host wall
  // milliseconds to *measured.
  double saver_call(bool pause, const std::vector<std::string>& tags, const std::string& what,
                    double* measured) {
    if (!saver_ || tags.empty()) return 0;
    const SimTime t0 = clock_.now();
    Backend& b = *rollout_gpu().backend;
    std::array<SimTime, static_cast<size_t>(Primitive::kCount)> before{};
    for (size_t k = 0; k < before.size(); ++k) before[k] = b.time_in(static_cast<Primitive>(k));
    const auto w0 = std::chrono::steady_clock::now();
    Result<SaverReport> r = pause ? saver_->pause(tags) : saver_->resume(tags);
    *measured +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
    // Where the simulated time went, per primitive.
    auto& split = pause ? pause_split_ : resume_split_;
    for (size_t k = 0; k < before.size(); ++k) {
      const SimTime d = b.time_in(static_cast<Primitive>(k)) - before[k];
      if (d > 0) split[to_string(static_cast<Primitive>(k))] += static_cast<double>(d) / 1e6;
    }
    if (!r.ok()) fail(r.error(), what);
    std::string why;
    if (!saver_->check_invariants(&why)) throw RunFailure{what + ": saver invariant: " + why};
    refresh_saver_gauges();
    return static_cast<double>(clock_.now() - t0) / 1e6;
  }

  uint64_t rollout_device_bytes() { return rollout_gpu().backend->usage().physical_bytes; }

  // The release phase: the saver pauses every tag, the engine empties its allocator's cache;
  // adds the device bytes that frees to the pauses' sum.
  void release(uint32_t i) {
    begin_phase(i, "release");
    const uint64_t before = rollout_device_bytes();
    pause_ms_ += saver_call(true, run_.saver_tags, "release (pause)", &measured_.pause_ms);
    check(rollout_gpu().rollout_alloc->empty_cache(), "empty_cache");
    sample(rollout_index());
    freed_bytes_ += before - rollout_device_bytes();
    ++r_.pauses;
  }

  // One resume stage of `tags`: its simulated ms; adds the device bytes it takes to *bytes and
  // counts the call in *calls.
  double resume_stage(const std::vector<std::string>& tags, const std::string& what,
                      double* measured, uint64_t* bytes, uint32_t* calls) {
    if (!saver_ || tags.empty()) return 0;
    const uint64_t before = rollout_device_bytes();
    const double ms = saver_call(false, tags, what, measured);
    *bytes += rollout_device_bytes() - before;
    ++*calls;
    return ms;
  }

  // ---- the timeline ---------------------------------------------------------------------------

  void init() {
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

  void iteration(uint32_t i) {
    const SimTime t_iter = clock_.now();
    const bool colocated = run_.placement == RlPlacement::kColocated;
    const bool offload_p = colocated && run_.offload_params;
    const bool offload_o = colocated && run_.offload_optimizer;
    // Rollout: replay the captured decode graph (it must still be valid), generate.
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

    // Release: the engine gives its memory back (SGLang release_memory_occupation / vLLM sleep),
    // then empties its allocator's cache.
    const SimTime t_train = clock_.now();
    if (colocated && saver_) release(i);
    // Trainer: reload, score, train, offload the optimizer.
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
    train_s_ += static_cast<double>(clock_.now() - t_train) / 1e9;

    // Weight sync: wake the weights (multi-stage) or everything, update them bucket by bucket,
    // drop the trainer's parameters, then wake the rest.
    begin_phase(i, "sync");
    const SimTime t_sync = clock_.now();
    if (colocated && saver_) {
      const std::vector<std::string> first =
          run_.multi_stage ? std::vector<std::string>{"weights"} : run_.saver_tags;
      resume_weights_ms_ += resume_stage(first, "resume (stage 1)", &measured_.resume_weights_ms,
                                         &resumed_weights_bytes_, &r_.resumes_weights);
    }
    sync_tensor_ = sync_offset_ = 0;
    exec(builder_.weight_sync(c_.sync_bucket_bytes), "weight sync");
    if (offload_p) {
      const SimTime t0 = clock_.now();
      exec(builder_.unload_params(true), "offload parameters");
      check(train_gpu().train_alloc->empty_cache(), "empty_cache");
      sample(0);
      offload_ms_ += static_cast<double>(clock_.now() - t0) / 1e6;
    }
    if (colocated && saver_ && run_.multi_stage) {
      begin_phase(i, "resume");
      resume_rest_ms_ +=
          resume_stage(saver_tags_except({"weights"}), "resume (stage 2)",
                       &measured_.resume_rest_ms, &resumed_rest_bytes_, &r_.resumes_rest);
    }
    sync_s_ += static_cast<double>(clock_.now() - t_sync) / 1e9;
    iteration_s_ += static_cast<double>(clock_.now() - t_iter) / 1e9;
  }

  void teardown() {
    for (Device& d : devices_) {
      check(d.train_alloc->release_all(), "teardown");
      check(d.rollout_alloc->release_all(), "teardown");
    }
    if (saver_) check(saver_->release_all(), "teardown");
    for (const auto& [slot, h] : host_) check(train_gpu().backend->host_free_pinned(h), "teardown");
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

  void summarize() {
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
    r_.reload_ms = reload_ms_ / n;
    for (const auto& [k, ms] : pause_split_) r_.pause_split_ms[k] = ms / n;
    for (const auto& [k, ms] : resume_split_) r_.resume_split_ms[k] = ms / n;
    r_.measured.pause_ms = measured_.pause_ms / n;
    r_.measured.resume_weights_ms = measured_.resume_weights_ms / n;
    r_.measured.resume_rest_ms = measured_.resume_rest_ms / n;
    r_.rollout_tokens_per_s =
        rollout_s_ > 0 ? static_cast<double>(rollout_tokens_) / rollout_s_ : 0;
    auto mean = [](uint64_t sum, uint32_t calls) { return calls == 0 ? 0 : sum / calls; };
    r_.pause_freed_bytes = mean(freed_bytes_, r_.pauses);
    r_.resume_weights_bytes = mean(resumed_weights_bytes_, r_.resumes_weights);
    r_.resume_rest_bytes = mean(resumed_rest_bytes_, r_.resumes_rest);
  }

  // ---- helpers --------------------------------------------------------------------------------

  void advance_s(double seconds) {
    clock_.advance(static_cast<SimTime>(std::llround(seconds * 1e9)));
  }

  [[noreturn]] void fail(const Error& e, const std::string& what) {
    const std::string where = r_.phases.empty()
                                  ? what
                                  : fmt::format("iteration {}, {}: {}", r_.phases.back().iteration,
                                                r_.phases.back().name, what);
    if (e.code == ErrorCode::kOutOfMemory)
      throw OutOfMemory{fmt::format("{} ({} short)", where, gib(e.bytes_short)), e.bytes_short};
    throw RunFailure{where + ": " + e.message};
  }

  void check(const Status& s, const std::string& what) {
    if (!s.ok()) fail(s.error(), what);
  }

  const RlConfig& c_;
  const ModelShape& m_;
  const RlRunSpec& run_;
  const RolloutPlan& plan_;
  const RlRunHooks& hooks_;
  TrainProgramBuilder builder_;
  SimClock clock_;
  std::vector<Device> devices_;
  std::unique_ptr<MemorySaver> saver_;
  std::vector<std::pair<DevPtr, uint64_t>> weights_, kv_;
  std::pair<DevPtr, uint64_t> graph_pool_{0, 0};
  StreamId stream_;
  GraphHandle graph_;
  std::unordered_map<uint64_t, Live> live_;
  std::unordered_map<uint64_t, DevPtr> host_;
  size_t sync_tensor_ = 0;
  uint64_t sync_offset_ = 0;
  size_t phase_first_sample_ = 0;
  bool phase_closed_ = true;
  double rollout_s_ = 0, train_s_ = 0, sync_s_ = 0, iteration_s_ = 0;
  double pause_ms_ = 0, resume_weights_ms_ = 0, resume_rest_ms_ = 0, offload_ms_ = 0,
         reload_ms_ = 0;
  uint64_t rollout_tokens_ = 0;
  uint64_t freed_bytes_ = 0, resumed_weights_bytes_ = 0, resumed_rest_bytes_ = 0;  // sums
  RlMeasured measured_;
  std::map<std::string, double> pause_split_, resume_split_;
  RlRunResult r_;
};

}  // namespace

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
  return Timeline(config, model, run, plan, hooks).run();
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
