// The RL timeline's rollout engine (rl_timeline_impl.h): its tensors through a saver or its
// caching allocator, the captured decode graph, the weight update, the saver's pause and resume,
// and the teardown baseline that frees the engine and builds it again.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "src/rl/rl_timeline_impl.h"

namespace memsim::rl_detail {

bool Timeline::via_saver(const std::string& tag) const {
  return saver_ &&
         std::find(run_.saver_tags.begin(), run_.saver_tags.end(), tag) != run_.saver_tags.end();
}

// A tensor of the engine: from the saver for its tags, else from the engine process's caching
// allocator (PyTorch tensors, the graph pool's segments).
DevPtr Timeline::engine_alloc(uint64_t bytes, const std::string& tag) {
  Result<DevPtr> p = via_saver(tag) ? saver_->malloc(bytes, tag)
                                    : rollout_gpu().rollout_alloc->malloc(bytes, StreamId{});
  if (!p.ok()) fail(p.error(), fmt::format("rollout engine: {} ({} bytes)", tag, bytes));
  if (!via_saver(tag)) add(rollout_index(), rollout_tag(tag), static_cast<int64_t>(bytes));
  return *p;
}

// The saver's tags' physical bytes into the gauges (after any saver call).
void Timeline::refresh_saver_gauges() {
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

void Timeline::init_rollout_engine() {
  // Weights as vLLM's fused parameters, the KV cache one tensor per layer, the graph pool.
  // What each holds on the device is read back from the gauges (see weights_reserved_bytes).
  const auto held = [&](RlTag t) { return rollout_gpu().bytes[static_cast<size_t>(t)]; };
  // Under TP, distributed init comes first: NCCL's communicator and first collective, the custom
  // all-reduce's buffers (kv_budget.h), held outside any saver until the end.
  if (const uint64_t comm = plan_.budget.comm.total(); comm > 0) {
    Result<DevPtr> p = rollout_gpu().backend->device_malloc(comm, "rollout.comm");
    if (!p.ok()) fail(p.error(), "rollout engine: NCCL and custom all-reduce memory");
    comm_ = *p;
    add(rollout_index(), RlTag::kRolloutComm, static_cast<int64_t>(comm), false);
    sample(rollout_index());
  }
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
  auto stream = rollout_gpu().backend->create_stream();
  if (!stream.ok()) fail(stream.error(), "create stream");
  stream_ = *stream;
  capture_decode_graph();
  engine_up_ = true;
  // The teardown baseline's pinned host copy of the weights, allocated once (pinning is slow).
  if (run_.teardown)
    for (uint64_t bytes : plan_.weight_tensors) {
      Result<DevPtr> h = rollout_gpu().backend->host_malloc_pinned(bytes);
      if (!h.ok()) fail(h.error(), "rollout engine: pinned host copy of the weights");
      weights_host_.push_back(*h);
    }
  sample(rollout_index());
}

// A decode graph reading every weight and writing every layer's KV and the graph pool: its
// replays after each resume tell whether the addresses it captured are still mapped.
void Timeline::capture_decode_graph() {
  Backend& b = *rollout_gpu().backend;
  check(b.begin_capture(stream_), "begin capture");
  for (const auto& [p, bytes] : weights_) check(b.fill(p, bytes, 0, stream_), "capture");
  for (const auto& [p, bytes] : kv_) check(b.fill(p, bytes, 0, stream_), "capture");
  if (graph_pool_.first)
    check(b.fill(graph_pool_.first, graph_pool_.second, 0, stream_), "capture");
  auto g = b.end_capture(stream_);
  if (!g.ok()) fail(g.error(), "end capture");
  graph_ = *g;
}

void Timeline::launch_decode_graph() {
  const Status s = rollout_gpu().backend->launch(graph_, stream_);
  ++r_.graph_launches;
  if (!s.ok() && r_.graphs_valid) {
    r_.graphs_valid = false;
    r_.graph_error = s.error().message;
  }
}

// Copies a bucket of gathered parameters into the rollout engine's weights (in order; the
// bucket sizes follow the trainer's units, the copies the engine's tensors); under the teardown
// baseline into their pinned host copy instead (the engine is down).
void Timeline::deliver(DevPtr src, uint64_t bytes, const std::string& what) {
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
  const SimTime t0 = clock_.now();
  copy_into_weights(rb, src, bytes, what);
  if (run_.teardown) {
    weights_out_ms_ += static_cast<double>(clock_.now() - t0) / 1e6;
    weights_out_bytes_ += bytes;
  }
}

void Timeline::copy_into_weights(Backend& b, DevPtr src, uint64_t bytes, const std::string& what) {
  uint64_t done = 0;
  while (done < bytes && sync_tensor_ < weights_.size()) {
    const auto& [dev, size] = weights_[sync_tensor_];
    const DevPtr dst = run_.teardown ? weights_host_[sync_tensor_] : dev;
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

// ---- saver ------------------------------------------------------------------------------------

Timeline::PrimitiveTimes Timeline::primitive_times() const {
  PrimitiveTimes t{};
  const Backend& b = *devices_.back().backend;
  for (size_t k = 0; k < t.size(); ++k) t[k] = b.time_in(static_cast<Primitive>(k));
  return t;
}

// Where the rollout GPU's simulated time went since `before`, per primitive, into `split`.
void Timeline::add_split(const PrimitiveTimes& before, std::map<std::string, double>& split) {
  const PrimitiveTimes now = primitive_times();
  for (size_t k = 0; k < now.size(); ++k) {
    const SimTime d = now[k] - before[k];
    if (d > 0) split[to_string(static_cast<Primitive>(k))] += static_cast<double>(d) / 1e6;
  }
}

std::vector<std::string> Timeline::saver_tags_except(const std::vector<std::string>& skip) const {
  std::vector<std::string> out;
  for (const std::string& t : run_.saver_tags)
    if (std::find(skip.begin(), skip.end(), t) == skip.end()) out.push_back(t);
  return out;
}

// Pauses or resumes `tags`; returns the simulated milliseconds and adds the host wall
// milliseconds to *measured.
double Timeline::saver_call(bool pause, const std::vector<std::string>& tags,
                            const std::string& what, double* measured) {
  if (!saver_ || tags.empty()) return 0;
  const SimTime t0 = clock_.now();
  const PrimitiveTimes before = primitive_times();
  const auto w0 = std::chrono::steady_clock::now();
  Result<SaverReport> r = pause ? saver_->pause(tags) : saver_->resume(tags);
  *measured +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
  add_split(before, pause ? pause_split_ : resume_split_);
  if (!r.ok()) fail(r.error(), what);
  std::string why;
  if (!saver_->check_invariants(&why)) throw RunFailure{what + ": saver invariant: " + why};
  refresh_saver_gauges();
  return static_cast<double>(clock_.now() - t0) / 1e6;
}

// The release phase: the saver pauses every tag, the engine empties its allocator's cache;
// adds the device bytes that frees to the pauses' sum.
void Timeline::release(uint32_t i) {
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
double Timeline::resume_stage(const std::vector<std::string>& tags, const std::string& what,
                              double* measured, uint64_t* bytes, uint32_t* calls) {
  if (!saver_ || tags.empty()) return 0;
  const uint64_t before = rollout_device_bytes();
  const double ms = saver_call(false, tags, what, measured);
  *bytes += rollout_device_bytes() - before;
  ++*calls;
  return ms;
}

// ---- the teardown baseline --------------------------------------------------------------------

void Timeline::free_engine_tensor(DevPtr p, uint64_t bytes, RlTag tag) {
  check(rollout_gpu().rollout_alloc->free(p), "teardown of the rollout engine");
  add(rollout_index(), tag, -static_cast<int64_t>(bytes));
}

// The release phase of the baseline: the engine destroys its graphs and frees its weights, KV
// cache and graph pool, then empties its allocator's cache (the memory goes back to the driver).
void Timeline::teardown_engine(uint32_t i) {
  begin_phase(i, "release");
  const SimTime t0 = clock_.now();
  const PrimitiveTimes split0 = primitive_times();
  const uint64_t before = rollout_device_bytes();
  check(rollout_gpu().backend->destroy_graph(graph_), "teardown: destroy graph");
  for (const auto& [p, bytes] : weights_) free_engine_tensor(p, bytes, RlTag::kWeights);
  for (const auto& [p, bytes] : kv_) free_engine_tensor(p, bytes, RlTag::kKvCache);
  if (graph_pool_.first)
    free_engine_tensor(graph_pool_.first, graph_pool_.second, RlTag::kCudaGraph);
  check(rollout_gpu().rollout_alloc->empty_cache(), "empty_cache");
  engine_up_ = false;
  sample(rollout_index());
  freed_bytes_ += before - rollout_device_bytes();
  ++r_.pauses;
  add_split(split0, pause_split_);
  pause_ms_ += static_cast<double>(clock_.now() - t0) / 1e6;
}

// The resume phase of the baseline: the engine allocates its weights and reads them back (from
// disk, then over PCIe), allocates its KV cache and graph pool and captures its graphs again.
void Timeline::rebuild_engine(uint32_t i) {
  begin_phase(i, "resume");
  Backend& b = *rollout_gpu().backend;
  SimTime t0 = clock_.now();
  const PrimitiveTimes split0 = primitive_times();
  uint64_t before = rollout_device_bytes();
  if (run_.teardown->weights_to == RlTeardown::WeightsTo::kDisk) {
    const SimTime d = clock_.now();
    advance_s(static_cast<double>(plan_.budget.weights) / run_.teardown->disk_bytes_per_s);
    resume_split_["disk_read"] += static_cast<double>(clock_.now() - d) / 1e6;
  }
  for (size_t k = 0; k < weights_.size(); ++k) {
    const uint64_t bytes = weights_[k].second;
    weights_[k].first = engine_alloc(bytes, "weights");
    sample(rollout_index());
    check(b.copy(weights_[k].first, weights_host_[k], bytes, StreamId{}), "reload weights");
    weights_in_bytes_ += bytes;
  }
  resume_weights_ms_ += static_cast<double>(clock_.now() - t0) / 1e6;
  resumed_weights_bytes_ += rollout_device_bytes() - before;
  ++r_.resumes_weights;
  t0 = clock_.now();
  before = rollout_device_bytes();
  for (auto& [p, bytes] : kv_) p = engine_alloc(bytes, "kv_cache");
  sample(rollout_index());
  if (graph_pool_.first) {
    graph_pool_.first = engine_alloc(graph_pool_.second, "cuda_graph");
    sample(rollout_index());
  }
  // The engine's capture sizes captured again (the capture model's time), then the decode
  // graph this timeline replays.
  clock_.advance(plan_.recapture_time);
  recapture_ms_ += static_cast<double>(plan_.recapture_time) / 1e6;
  resume_split_["recapture"] += static_cast<double>(plan_.recapture_time) / 1e6;
  capture_decode_graph();
  engine_up_ = true;
  sample(rollout_index());
  resume_rest_ms_ += static_cast<double>(clock_.now() - t0) / 1e6;
  resumed_rest_bytes_ += rollout_device_bytes() - before;
  ++r_.resumes_rest;
  add_split(split0, resume_split_);
}

}  // namespace memsim::rl_detail
