// Capture runner implementation: schedules captures (fixed list or seeded dynamic arrivals) on
// the event queue, runs each graph's allocation program through the strategy, replays, checks.
#include "src/drivers/capture_runner.h"

#include <fmt/format.h>
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "backends/sim/sim_backend.h"
#include "core/event_queue.h"
#include "src/alloc/device_segment_source.h"
#include "src/alloc/torch_caching.h"

namespace memsim {

const char* to_string(CaptureOrder v) {
  switch (v) {
    case CaptureOrder::kArrival:
      return "arrival";
    case CaptureOrder::kLargeFirst:
      return "large_first";
    case CaptureOrder::kList:
      return "list";
  }
  return "?";
}
const char* to_string(Arrival v) {
  return v == Arrival::kFixed ? "fixed" : "dynamic";
}
const char* to_string(InputBuffers v) {
  return v == InputBuffers::kPerShape ? "per_shape" : "persistent";
}
const char* to_string(OutputLifetime v) {
  return v == OutputLifetime::kStrong ? "strong" : "weak";
}
const char* to_string(GraphRunners v) {
  switch (v) {
    case GraphRunners::kFull:
      return "full";
    case GraphRunners::kPiecewise:
      return "piecewise";
    case GraphRunners::kBoth:
      return "both";
  }
  return "?";
}

std::vector<uint32_t> vllm_capture_sizes(uint32_t max_num_seqs) {
  const uint32_t cap = std::min<uint32_t>(2 * max_num_seqs, 512);
  std::vector<uint32_t> sizes;
  for (uint32_t s : {1u, 2u, 4u})
    if (s <= cap) sizes.push_back(s);
  for (uint32_t s = 8; s <= std::min<uint32_t>(cap, 256); s += 8) sizes.push_back(s);
  for (uint32_t s = 272; s <= cap; s += 16) sizes.push_back(s);
  return sizes;
}

const ShapeProgram& ProgramCache::get(const ModelShape& model, uint32_t batch,
                                      const ProgramOptions& o) {
  auto key = std::make_pair(batch, o.mode);
  auto it = programs_.find(key);
  if (it == programs_.end())
    it = programs_.emplace(key, make_decode_program(model, batch, o)).first;
  return it->second;
}

namespace {

// Inside Runner: evaluate a Status/Result; on error record the failure and return false.
#define RUNNER_TRY(expr, batch)                                     \
  do {                                                              \
    auto runner_res_ = (expr);                                      \
    if (!runner_res_.ok()) return fail(runner_res_.error(), batch); \
  } while (0)

class Runner {
 public:
  Runner(const CaptureRunConfig& c, Backend& b, SimClock& clock, GraphMemoryStrategy& s,
         MetricsRecorder& m)
      : cfg_(c),
        backend_(b),
        clock_(clock),
        strategy_(s),
        metrics_(m),
        queue_(clock),
        default_source_(b, "default_pool"),
        default_pool_(default_source_),
        reserved_series_(m.series("strategy_reserved")) {}

  CaptureRunResult run();

 private:
  // Records a failure; returns false so callers can `return fail(...)`.
  bool fail(const Error& e, uint32_t batch);
  void violation(const std::string& what);
  std::vector<const ShapeProgram*>& programs(uint32_t batch);
  bool ensure_inputs(uint32_t batch);
  bool update_inputs(uint32_t batch, uint32_t actual);
  bool capture_shape(uint32_t batch);
  bool capture_graph(uint32_t batch, uint32_t runner, uint32_t piece, const GraphProgram& g,
                     bool last_piece, std::vector<DevPtr>& prev_outputs);
  bool fill_capture(uint32_t batch, const GraphProgram& g, uint64_t graph_no,
                    std::vector<DevPtr>& ptr, std::vector<uint32_t>& patterns, bool inputs_read);
  bool body_capture(uint32_t batch, const GraphProgram& g, std::vector<DevPtr>& ptr);
  bool prepare_body(uint32_t batch);
  bool replay_shape(uint32_t batch, uint32_t actual);
  void track_alloc(DevPtr p, uint64_t bytes);
  void untrack(DevPtr p) { live_.erase(p); }
  void check_conformance(const std::string& where);
  void teardown();
  void close_open_capture(std::vector<DevPtr>& body);
  uint32_t pad(uint32_t batch) const;
  void record_point(uint32_t batch);

  const CaptureRunConfig& cfg_;
  Backend& backend_;
  SimClock& clock_;
  GraphMemoryStrategy& strategy_;
  MetricsRecorder& metrics_;
  EventQueue queue_;
  DeviceSegmentSource default_source_;
  TorchCachingAllocator default_pool_;
  MetricsRecorder::SeriesId reserved_series_;
  StreamId stream_{};
  CaptureRunResult result_;
  bool stopped_ = false;

  ProgramCache own_cache_;
  std::map<uint32_t, ShapeProgram> custom_;  // cfg_.program_for's, by batch
  std::map<uint32_t, std::vector<const ShapeProgram*>> programs_;
  std::map<DevPtr, uint64_t> live_;        // every live tensor, for the overlap check
  std::vector<DevPtr> runner_owned_;       // inputs and workspace (default pool)
  std::map<uint32_t, bool> inputs_ready_;  // per shape (per_shape inputs)
  std::map<uint32_t, std::vector<CheckedTensor>> inputs_of_;      // by inputs key (0 = persistent)
  std::map<uint32_t, std::vector<InputBufferSpec>> input_specs_;  // by inputs key
  std::map<uint32_t, std::vector<CheckedTensor>> step_inputs_;    // update sources, by inputs key
  std::map<uint32_t, std::vector<CheckedTensor>> final_outputs_;  // per shape
  CapturedView view_;
  DevPtr workspace_ = 0;
  std::vector<DevPtr> held_outputs_;                     // strategy-owned, freed at teardown
  std::map<uint32_t, std::vector<GraphHandle>> graphs_;  // per shape, in launch order
  std::set<uint32_t> captured_;
  uint64_t graph_counter_ = 0;
};

bool Runner::fail(const Error& e, uint32_t batch) {
  if (result_.ok) {
    result_.ok = false;
    result_.out_of_memory = e.code == ErrorCode::kOutOfMemory;
    result_.failure = e.message;
    result_.failed_batch = batch;
    result_.bytes_short = e.bytes_short;
  }
  stopped_ = true;
  return false;
}

void Runner::violation(const std::string& what) {
  if (result_.invariant_violation.empty()) result_.invariant_violation = what;
}

std::vector<const ShapeProgram*>& Runner::programs(uint32_t batch) {
  auto it = programs_.find(batch);
  if (it != programs_.end()) return it->second;
  if (cfg_.program_for) {
    const ShapeProgram& p = custom_.emplace(batch, cfg_.program_for(batch)).first->second;
    return programs_.emplace(batch, std::vector<const ShapeProgram*>{&p}).first->second;
  }
  ProgramCache& cache = cfg_.programs ? *cfg_.programs : own_cache_;
  ProgramOptions o;
  o.gemm_workspace_bytes = cfg_.gemm_workspace_bytes;
  o.max_model_len = cfg_.max_model_len;
  o.kv_block_size = cfg_.kv_block_size;
  o.tensor_parallel = cfg_.tensor_parallel;
  o.vocab_padded = cfg_.vocab_padded;
  o.vocab = cfg_.vocab;
  o.first_stage = cfg_.first_stage;
  o.last_stage = cfg_.last_stage;
  std::vector<const ShapeProgram*> out;
  if (cfg_.runners != GraphRunners::kPiecewise) {
    o.mode = GraphMode::kFull;
    out.push_back(&cache.get(cfg_.model, batch, o));
  }
  if (cfg_.runners != GraphRunners::kFull) {
    o.mode = GraphMode::kPiecewise;
    out.push_back(&cache.get(cfg_.model, batch, o));
  }
  return programs_.emplace(batch, std::move(out)).first->second;
}

void Runner::track_alloc(DevPtr p, uint64_t bytes) {
  if (!cfg_.check_invariants) {
    live_.emplace(p, bytes);
    return;
  }
  auto next = live_.lower_bound(p);
  if (next != live_.end() && next->first < p + bytes)
    violation(
        fmt::format("allocation {:#x}+{} overlaps live tensor at {:#x}", p, bytes, next->first));
  if (next != live_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > p)
      violation(
          fmt::format("allocation {:#x}+{} overlaps live tensor at {:#x}", p, bytes, prev->first));
  }
  live_.emplace(p, bytes);
}

bool Runner::ensure_inputs(uint32_t batch) {
  const bool persistent = cfg_.inputs == InputBuffers::kPersistent;
  const uint32_t key = persistent ? 0 : batch;
  if (inputs_ready_[key]) return true;
  const uint32_t largest = cfg_.inputs_sized_for ? cfg_.inputs_sized_for
                                                 : *std::max_element(cfg_.capture_sizes.begin(),
                                                                     cfg_.capture_sizes.end());
  const uint32_t sized_for = persistent ? largest : batch;
  // Inputs are allocated outside any capture from the default pool (PyTorch's default
  // allocator); persistent inputs are sized once for the largest shape (xLLM PersistentParam).
  std::vector<InputBufferSpec>& specs = input_specs_[key];
  specs = cfg_.input_set == InputSet::kXllm
              ? xllm_persistent_inputs(cfg_.model, cfg_.max_model_len, cfg_.kv_block_size)
              : program_input_buffers(*programs(sized_for).front());
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t bytes = specs[i].bytes(sized_for);
    auto p = default_pool_.malloc(bytes, stream_);
    if (!p.ok()) return fail(p.error(), batch);
    track_alloc(*p, bytes);
    runner_owned_.push_back(*p);
    const auto pattern = static_cast<uint32_t>(0x5EED0000u + key * 64 + i);
    RUNNER_TRY(backend_.fill(*p, bytes, pattern, stream_), batch);
    inputs_of_[key].push_back(CheckedTensor{*p, bytes, pattern, batch, specs[i].name});
  }
  inputs_ready_[key] = true;
  return true;
}

// xLLM's update() before a replay of the graphs padded to `batch` for `actual` sequences: the
// step's inputs (device buffers like the inputs, filled with their patterns, allocated from the
// default pool at the key's first replay) are copied into the front rows, padding rows filled.
bool Runner::update_inputs(uint32_t batch, uint32_t actual) {
  const uint32_t key = cfg_.inputs == InputBuffers::kPersistent ? 0 : batch;
  const std::vector<CheckedTensor>& inputs = inputs_of_[key];
  std::vector<CheckedTensor>& step = step_inputs_[key];
  const std::vector<InputBufferSpec>& specs = input_specs_[key];
  if (step.empty()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const CheckedTensor& in = inputs[i];
      if (!specs[i].updated) {  // the graph writes it (hidden_states): nothing to copy from
        step.push_back(CheckedTensor{});
        continue;
      }
      auto p = default_pool_.malloc(in.bytes, stream_);
      if (!p.ok()) return fail(p.error(), batch);
      track_alloc(*p, in.bytes);
      runner_owned_.push_back(*p);
      RUNNER_TRY(backend_.fill(*p, in.bytes, in.pattern, stream_), batch);
      step.push_back(CheckedTensor{*p, in.bytes, in.pattern, batch, "step." + in.name});
    }
  }
  const SimTime start = clock_.now();
  for (const InputUpdateOp& op : input_update_ops(specs, actual, batch)) {
    const CheckedTensor& dst = inputs[op.index];
    if (op.offset + op.bytes > dst.bytes || op.bytes == 0) continue;
    if (op.fill) {
      RUNNER_TRY(backend_.fill(dst.ptr + op.offset, op.bytes, dst.pattern, stream_), batch);
    } else {
      RUNNER_TRY(backend_.copy(dst.ptr, step[op.index].ptr, op.bytes, stream_), batch);
    }
    result_.input_update_bytes += op.bytes;
    ++result_.input_update_ops;
  }
  result_.input_update_time += clock_.now() - start;
  return true;
}

uint32_t Runner::pad(uint32_t batch) const {
  uint32_t best = UINT32_MAX;
  for (uint32_t s : cfg_.capture_sizes)
    if (s >= batch) best = std::min(best, s);
  return best;
}

void Runner::record_point(uint32_t batch) {
  const Usage u = backend_.usage();
  CurvePoint pt;
  pt.shapes_captured = static_cast<uint32_t>(captured_.size());
  pt.batch = batch;
  pt.time = clock_.now();
  pt.physical = u.physical_bytes;
  pt.virtual_mapped = u.virtual_mapped;
  pt.strategy_reserved = strategy_.stats().reserved_bytes;
  result_.curve.push_back(pt);
}

void Runner::check_conformance(const std::string& where) {
  if (!cfg_.check_invariants) return;
  std::string why;
  if (!strategy_.check_invariants(&why)) violation(where + ": strategy: " + why);
  const Usage u = backend_.usage();
  auto tag = [&](const char* name) {
    auto it = u.per_tag.find(name);
    return it == u.per_tag.end() ? uint64_t{0} : it->second;
  };
  const uint64_t reported = strategy_.stats().reserved_bytes;
  const uint64_t held = tag("graph_pool") + tag("graph_mem");
  if (reported != held)
    violation(fmt::format("{}: strategy reports {} bytes but the backend holds {} for it", where,
                          reported, held));
  if (reported > u.physical_bytes)
    violation(fmt::format("{}: strategy reports more than the backend's physical bytes", where));
}

void Runner::close_open_capture(std::vector<DevPtr>& body) {
  // A failure inside a capture: free the body's live tensors inside it, end and destroy it.
  for (DevPtr p : body) {
    if (p == 0 || p == workspace_) continue;
    (void)strategy_.free(p, stream_);
    untrack(p);
  }
  auto g = backend_.end_capture(stream_);
  (void)strategy_.end_graph();
  if (g.ok()) (void)backend_.destroy_graph(*g);
}

// The program's ops with a fill kernel per allocation (each tensor's producer writes a pattern
// unique to the graph and tensor), inside the open capture. A program with body_nodes (a real
// body's, simulated) gets the rest of its nodes beside the fills and input reads, so the graph
// is priced at the body's node count.
bool Runner::fill_capture(uint32_t batch, const GraphProgram& g, uint64_t graph_no,
                          std::vector<DevPtr>& ptr, std::vector<uint32_t>& patterns,
                          bool inputs_read) {
  uint64_t own_nodes = 0;  // fills and copies made
  for (const ProgramOp& op : g.ops) {
    const TensorSpec& t = g.tensors[op.tensor];
    if (op.kind == ProgramOp::Kind::kFree) {
      if (auto s = strategy_.free(ptr[op.tensor], stream_); !s.ok()) {
        close_open_capture(ptr);
        return fail(s.error(), batch);
      }
      untrack(ptr[op.tensor]);
      ptr[op.tensor] = 0;
      continue;
    }
    if (t.role == TensorRole::kWorkspace) {
      ptr[op.tensor] = workspace_;  // allocated by the warm-up, before any capture
      continue;
    }
    auto p = strategy_.allocate(t.bytes, stream_);
    if (!p.ok()) {
      close_open_capture(ptr);
      return fail(p.error(), batch);
    }
    ptr[op.tensor] = *p;
    track_alloc(*p, t.bytes);
    // The kernel producing the tensor writes a pattern unique to the graph and tensor.
    const auto pattern = static_cast<uint32_t>(graph_no * 0x9E3779B1u + op.tensor);
    patterns[op.tensor] = pattern;
    if (auto s = backend_.fill(*p, t.bytes, pattern, stream_); !s.ok()) {
      close_open_capture(ptr);
      return fail(s.error(), batch);
    }
    ++own_nodes;
    if (!inputs_read && t.role == TensorRole::kIntermediate) {
      // The forward reads its inputs: a replay then proves they are mapped and valid. The
      // reads land in this (first) intermediate, which no check looks at afterwards.
      inputs_read = true;
      const uint32_t key = cfg_.inputs == InputBuffers::kPersistent ? 0 : batch;
      for (const CheckedTensor& in : inputs_of_[key]) {
        if (auto s = backend_.copy(*p, in.ptr, std::min(in.bytes, t.bytes), stream_); !s.ok()) {
          close_open_capture(ptr);
          return fail(s.error(), batch);
        }
        ++own_nodes;
      }
    }
  }
  if (g.body_nodes > own_nodes) {
    if (auto s = backend_.add_captured_nodes(stream_, g.body_nodes - own_nodes); !s.ok()) {
      close_open_capture(ptr);
      return fail(s.error(), batch);
    }
  }
  return true;
}

namespace {

// The body's view of the strategy: allocations and frees go to the strategy (overlap-checked)
// and are recorded as (kind, tensor index in allocation order, bytes) for the comparison with
// the program.
class RecordingAllocator final : public TensorAllocator {
 public:
  struct Op {
    ProgramOp::Kind kind;
    uint32_t tensor;
    uint64_t bytes;
  };
  RecordingAllocator(std::function<Result<DevPtr>(uint64_t)> alloc,
                     std::function<Status(DevPtr)> release)
      : alloc_(std::move(alloc)), release_(std::move(release)) {}
  Result<DevPtr> allocate(uint64_t bytes) override {
    MEMSIM_ASSIGN_OR_RETURN(DevPtr p, alloc_(bytes));
    index_[p] = static_cast<uint32_t>(ptrs.size());
    ops.push_back({ProgramOp::Kind::kAlloc, static_cast<uint32_t>(ptrs.size()), bytes});
    ptrs.push_back(p);
    return p;
  }
  Status free(DevPtr p) override {
    auto it = index_.find(p);
    if (it == index_.end())
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("graph body frees {:#x}, which it did not allocate", p));
    MEMSIM_TRY(release_(p));
    ops.push_back({ProgramOp::Kind::kFree, it->second, 0});
    ptrs[it->second] = 0;
    index_.erase(it);
    return {};
  }
  std::vector<Op> ops;
  std::vector<DevPtr> ptrs;  // by tensor index; 0 once freed

 private:
  std::function<Result<DevPtr>(uint64_t)> alloc_;
  std::function<Status(DevPtr)> release_;
  std::map<DevPtr, uint32_t> index_;
};

// The first difference between what the body did and the program, or "".
std::string compare_ops(const GraphProgram& g, const std::vector<RecordingAllocator::Op>& ops) {
  auto show = [](ProgramOp::Kind k, uint32_t t, uint64_t bytes) {
    return k == ProgramOp::Kind::kAlloc ? fmt::format("alloc #{} of {} bytes", t, bytes)
                                        : fmt::format("free #{}", t);
  };
  for (size_t i = 0; i < std::max(g.ops.size(), ops.size()); ++i) {
    const bool both = i < g.ops.size() && i < ops.size();
    if (both && g.ops[i].kind == ops[i].kind && g.ops[i].tensor == ops[i].tensor &&
        (ops[i].kind == ProgramOp::Kind::kFree || g.tensors[g.ops[i].tensor].bytes == ops[i].bytes))
      continue;
    const std::string got =
        i < ops.size() ? show(ops[i].kind, ops[i].tensor, ops[i].bytes) : std::string("nothing");
    std::string want = "nothing";
    if (i < g.ops.size()) {
      const TensorSpec& t = g.tensors[g.ops[i].tensor];
      want = show(g.ops[i].kind, g.ops[i].tensor, t.bytes) + " (" + t.name + ")";
    }
    return fmt::format("graph {}: op {} of the body is {}, the program's is {}", g.name, i, got,
                       want);
  }
  return {};
}

}  // namespace

// The body's real work inside the open capture; its allocation order must be the program's.
bool Runner::body_capture(uint32_t batch, const GraphProgram& g, std::vector<DevPtr>& ptr) {
  RecordingAllocator mem(
      [&](uint64_t bytes) -> Result<DevPtr> {
        MEMSIM_ASSIGN_OR_RETURN(DevPtr p, strategy_.allocate(bytes, stream_));
        track_alloc(p, bytes);
        return p;
      },
      [&](DevPtr p) -> Status {
        MEMSIM_TRY(strategy_.free(p, stream_));
        untrack(p);
        return {};
      });
  Result<uint64_t> nodes = cfg_.body->capture(batch, g, mem, stream_);
  Status st = nodes.ok() ? backend_.add_captured_nodes(stream_, *nodes) : Status(nodes.error());
  if (!st.ok()) {  // free what the failed body still holds inside the capture, and end it
    std::vector<DevPtr> held = mem.ptrs;
    close_open_capture(held);
    return fail(st.error(), batch);
  }
  for (size_t i = 0; i < ptr.size(); ++i) ptr[i] = i < mem.ptrs.size() ? mem.ptrs[i] : 0;
  if (std::string diff = compare_ops(g, mem.ops); !diff.empty()) violation(diff);
  result_.body_nodes.push_back({g.name, batch, *nodes, g.body_nodes});
  return true;
}

bool Runner::capture_graph(uint32_t batch, uint32_t runner, uint32_t piece, const GraphProgram& g,
                           bool last_piece, std::vector<DevPtr>& prev_outputs) {
  const SimTime start = clock_.now();
  GraphInfo info{batch, runner, piece, g.name};
  RUNNER_TRY(strategy_.begin_graph(info, stream_), batch);
  if (auto s = backend_.begin_capture(stream_); !s.ok()) {
    (void)strategy_.end_graph();
    return fail(s.error(), batch);
  }
  std::vector<DevPtr> ptr(g.tensors.size(), 0);
  std::vector<uint32_t> patterns(g.tensors.size(), 0);
  const uint64_t graph_no = ++graph_counter_;
  bool inputs_read = piece != 0;
  if (cfg_.body ? !body_capture(batch, g, ptr)
                : !fill_capture(batch, g, graph_no, ptr, patterns, inputs_read))
    return false;
  std::vector<DevPtr> outputs;
  std::vector<CheckedTensor> checked;
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    if (g.tensors[i].role != TensorRole::kOutput) continue;
    outputs.push_back(ptr[i]);
    checked.push_back(CheckedTensor{ptr[i], g.tensors[i].bytes, patterns[i], batch,
                                    g.name + "." + g.tensors[i].name});
  }
  if (last_piece) final_outputs_[batch] = checked;
  const bool weak = cfg_.outputs == OutputLifetime::kWeak;
  if (weak) {
    // vLLM keeps only weak references to captured outputs, so their blocks return to the pool:
    // the previous piece's outputs die once this piece has read them, and the last graph's
    // outputs die with the capture. Freed inside the capture, they are reusable within it.
    std::vector<DevPtr> dying = prev_outputs;
    if (last_piece) dying.insert(dying.end(), outputs.begin(), outputs.end());
    for (DevPtr o : dying) {
      if (auto s = strategy_.free(o, stream_); !s.ok()) {
        close_open_capture(ptr);
        return fail(s.error(), batch);
      }
      untrack(o);
    }
    prev_outputs = last_piece ? std::vector<DevPtr>{} : outputs;
  } else {
    held_outputs_.insert(held_outputs_.end(), outputs.begin(), outputs.end());
    if (!outputs.empty() && !strategy_.preserves_held_tensors())
      result_.held_outputs_preserved = false;
  }
  auto graph = backend_.end_capture(stream_);
  (void)strategy_.end_graph();
  if (!graph.ok()) return fail(graph.error(), batch);
  graphs_[batch].push_back(*graph);
  ++result_.graphs;
  // Warm-up replay: the graph's memory is realized (graph memory nodes map pages here).
  RUNNER_TRY(backend_.launch(*graph, stream_), batch);
  ++result_.launches;
  metrics_.set(reserved_series_, static_cast<double>(strategy_.stats().reserved_bytes));
  result_.capture_time += clock_.now() - start;
  return true;
}

bool Runner::prepare_body(uint32_t batch) {
  if (!cfg_.body) return true;
  const uint32_t key = cfg_.inputs == InputBuffers::kPersistent ? 0 : batch;
  RUNNER_TRY(cfg_.body->prepare(batch, inputs_of_[key], stream_), batch);
  return true;
}

bool Runner::capture_shape(uint32_t batch) {
  if (!ensure_inputs(batch) || !prepare_body(batch)) return false;
  const auto& progs = programs(batch);
  for (size_t r = 0; r < progs.size(); ++r) {
    const uint32_t runner = cfg_.runners == GraphRunners::kPiecewise ? 1 : static_cast<uint32_t>(r);
    std::vector<DevPtr> prev_outputs;
    const auto& graphs = progs[r]->graphs;
    for (size_t k = 0; k < graphs.size(); ++k) {
      if (!capture_graph(batch, runner, static_cast<uint32_t>(k), graphs[k], k + 1 == graphs.size(),
                         prev_outputs)) {
        // Outputs still held by the failed forward are released at teardown.
        held_outputs_.insert(held_outputs_.end(), prev_outputs.begin(), prev_outputs.end());
        return false;
      }
    }
  }
  captured_.insert(batch);
  view_.shapes.push_back(batch);
  record_point(batch);
  if (cfg_.observer) cfg_.observer->after_shape(batch);
  check_conformance(fmt::format("after capturing b={}", batch));
  return true;
}

bool Runner::replay_shape(uint32_t batch, uint32_t actual) {
  if (!prepare_body(batch)) return false;
  if (!cfg_.body && !update_inputs(batch, actual)) return false;
  for (GraphHandle g : graphs_[batch]) {
    RUNNER_TRY(backend_.launch(g, stream_), batch);
    ++result_.launches;
  }
  return true;
}

void Runner::teardown() {
  std::string why;
  if (cfg_.check_invariants && !default_pool_.check_invariants(&why))
    violation("default pool: " + why);
  for (DevPtr o : held_outputs_) {
    // A failed free here is the strategy's bookkeeping breaking (vmm_alias, spaces: one).
    if (auto s = strategy_.free(o, stream_); !s.ok()) fail(s.error(), 0);
    untrack(o);
  }
  held_outputs_.clear();
  for (auto& [batch, graphs] : graphs_)
    for (GraphHandle g : graphs) (void)backend_.destroy_graph(g);
  graphs_.clear();
  for (DevPtr p : runner_owned_) {
    (void)default_pool_.free(p);
    untrack(p);
  }
  runner_owned_.clear();
  (void)default_pool_.release_all();
  if (auto s = strategy_.teardown(); !s.ok()) violation("teardown: " + s.error().message);
  const Usage u = backend_.usage();
  result_.released_all = u.physical_bytes == 0 && u.virtual_mapped == 0 &&
                         u.virtual_reserved == 0 && strategy_.stats().reserved_bytes == 0;
  if (!result_.released_all)
    violation(
        fmt::format("after teardown the backend still holds {} physical, {} mapped, {} "
                    "reserved bytes",
                    u.physical_bytes, u.virtual_mapped, u.virtual_reserved));
}

CaptureRunResult Runner::run() {
  if (cfg_.capture_sizes.empty()) {
    fail(make_error(ErrorCode::kInvalidArgument, "no capture sizes"), 0);
    return result_;
  }
  if (cfg_.body && cfg_.input_set != InputSet::kProgram) {
    fail(make_error(ErrorCode::kInvalidArgument,
                    "a graph body writes its own inputs: input_set must be program"),
         0);
    return result_;
  }
  if ((cfg_.program_for || cfg_.body) && cfg_.runners != GraphRunners::kFull) {
    fail(make_error(ErrorCode::kInvalidArgument,
                    "custom programs and graph bodies capture full graphs only"),
         0);
    return result_;
  }
  auto stream = backend_.create_stream();
  if (!stream.ok()) {
    fail(stream.error(), 0);
    return result_;
  }
  stream_ = *stream;
  // Warm-up: the GEMM library's workspace for the capture stream exists before any capture.
  if (cfg_.gemm_workspace_bytes > 0) {
    auto p = default_pool_.malloc(cfg_.gemm_workspace_bytes, stream_);
    if (!p.ok()) {
      fail(p.error(), 0);
    } else {
      workspace_ = *p;
      runner_owned_.push_back(*p);
      track_alloc(*p, cfg_.gemm_workspace_bytes);
    }
  }
  if (!stopped_ && cfg_.arrival == Arrival::kFixed) {
    std::vector<uint32_t> order = cfg_.capture_sizes;
    if (cfg_.order == CaptureOrder::kLargeFirst)
      std::sort(order.begin(), order.end(), std::greater<>());
    else if (cfg_.order == CaptureOrder::kList)
      order = cfg_.order_list;
    // One event per capture, in order: the queue serializes them on the host thread.
    for (uint32_t b : order)
      queue_.schedule(0, [this, b] {
        if (!stopped_) capture_shape(b);
      });
    for (uint32_t actual : cfg_.replays)
      queue_.schedule(0, [this, actual] {
        const uint32_t b = pad(actual);
        if (stopped_) return;
        if (actual == 0 || !captured_.count(b)) {
          fail(
              make_error(ErrorCode::kInvalidArgument,
                         fmt::format("replay of {} sequences: no captured shape holds it", actual)),
              actual);
          return;
        }
        replay_shape(b, actual);
      });
  } else if (!stopped_) {
    std::mt19937_64 rng(cfg_.seed);
    const uint32_t largest =
        *std::max_element(cfg_.capture_sizes.begin(), cfg_.capture_sizes.end());
    std::uniform_int_distribution<uint32_t> batch_dist(1, largest);
    std::exponential_distribution<double> gap(1.0 / cfg_.dynamic.mean_interarrival_us);
    double t_us = 0;
    for (uint32_t i = 0; i < cfg_.dynamic.arrivals; ++i) {
      t_us += gap(rng);
      const uint32_t actual = batch_dist(rng);
      const uint32_t b = pad(actual);
      queue_.schedule(static_cast<SimTime>(t_us * 1000.0), [this, b, actual] {
        if (stopped_) return;
        // First sight of a shape captures it (never re-captured); later arrivals replay it.
        if (!captured_.count(b)) {
          capture_shape(b);
          return;
        }
        replay_shape(b, actual);
      });
    }
  }
  queue_.run();
  if (cfg_.observer && result_.ok) {
    view_.stream = stream_;
    view_.graphs = &graphs_;
    for (const auto& [key, tensors] : inputs_of_)
      view_.inputs.insert(view_.inputs.end(), tensors.begin(), tensors.end());
    view_.outputs = final_outputs_;
    view_.outputs_held = cfg_.outputs == OutputLifetime::kStrong;
    view_.held_preserved = result_.held_outputs_preserved;
    view_.body = cfg_.body;
    cfg_.observer->before_teardown(view_);
  }
  result_.shapes_captured = static_cast<uint32_t>(captured_.size());
  result_.switch_time = strategy_.stats().switch_time;
  result_.peak_strategy_reserved = strategy_.stats().peak_reserved_bytes;
  result_.end_time = clock_.now();
  teardown();
  auto peak = [&](const char* name) { return static_cast<uint64_t>(metrics_.peak(name)); };
  result_.peak_physical = peak("physical_bytes");
  result_.peak_virtual_mapped = peak("virtual_mapped");
  result_.peak_virtual_reserved = peak("virtual_reserved");
  result_.peak_graph_mem = peak("graph_mem_reserved");
  result_.peak_strategy_reserved =
      std::max<uint64_t>(result_.peak_strategy_reserved, peak("strategy_reserved"));
  return result_;
}

}  // namespace

CaptureRunResult run_captures(const CaptureRunConfig& config, Backend& backend, SimClock& clock,
                              GraphMemoryStrategy& strategy, MetricsRecorder& metrics) {
  Runner runner(config, backend, clock, strategy, metrics);
  return runner.run();
}

CaptureRunResult run_captures_on_sim(
    const CaptureRunConfig& config, const GpuSpec& gpu,
    const std::function<std::unique_ptr<GraphMemoryStrategy>(Backend&)>& make_strategy,
    SimClock& clock, MetricsRecorder& metrics) {
  SimBackend backend(gpu, clock, &metrics);
  backend.hold_elsewhere(config.resident_bytes);
  auto strategy = make_strategy(backend);
  CaptureRunResult result = run_captures(config, backend, clock, *strategy, metrics);
  std::string why;
  if (!backend.check_invariants(&why) && result.invariant_violation.empty())
    result.invariant_violation = "backend: " + why;
  return result;
}

}  // namespace memsim
