// CUDA validation of the shapes experiment: identical strategy bytes on both backends, measured
// device usage within one granule per physical allocation, per-primitive times, replay checks.
#include "src/app/cuda_validation.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "backends/cuda/cuda_backend.h"
#include "kernels/attention.h"
#include "src/app/in_context_fit.h"
#include "src/app/writers.h"
#include "src/exec/graph_body.h"

namespace memsim {
namespace {

struct ReplayStats {
  uint64_t rounds = 0;
  uint64_t launches = 0;
  uint64_t checks = 0;
  uint64_t failed_checks = 0;  // tensors with mismatching words
  uint64_t mismatched_words = 0;
  std::string first_failure;
  std::string error;
};

// Samples device usage after every captured shape, and replays with checks before teardown.
class Harness final : public CaptureObserver {
 public:
  Harness(CudaBackend& cuda, uint64_t free_at_start, bool driver_managed, uint64_t seed,
          uint32_t rounds)
      : cuda_(cuda),
        free0_(free_at_start),
        driver_managed_(driver_managed),
        seed_(seed),
        rounds_(rounds) {}

  void after_shape(uint32_t /*batch*/) override { sample(); }

  void before_teardown(const CapturedView& view) override {
    sample();
    std::mt19937_64 rng(seed_);
    if (view.shapes.empty()) return;
    std::uniform_int_distribution<size_t> pick(0, view.shapes.size() - 1);
    for (uint32_t round = 0; round < rounds_; ++round) {
      const uint32_t b = view.shapes[pick(rng)];
      if (view.body) {  // the executor's step reads the shape's metadata from its input
        if (auto s = view.body->prepare(b, view.inputs, view.stream); !s.ok()) {
          replay_.error = s.error().message;
          return;
        }
      }
      for (GraphHandle g : view.graphs->at(b)) {
        if (auto s = cuda_.launch(g, view.stream); !s.ok()) {
          replay_.error = s.error().message;
          return;
        }
        ++replay_.launches;
      }
      ++replay_.rounds;
      // Inputs are written once, outside every graph: no replay may touch them. (The
      // executor's body rewrites its metadata input before each replay: nothing to check.)
      if (!view.body)
        for (const CheckedTensor& t : view.inputs) check(t, view.stream, "input");
      // The replayed shape's outputs hold its pattern right after its replay (driver-managed
      // graph memory frees weak outputs inside the graph: nothing to read then).
      const bool own_readable = view.outputs_held || !driver_managed_;
      if (own_readable)
        for (const CheckedTensor& t : view.outputs.at(b)) check(t, view.stream, "output");
      // Held outputs of every other shape must survive, where the strategy promises it.
      if (view.outputs_held && view.held_preserved)
        for (const auto& [other, tensors] : view.outputs)
          if (other != b)
            for (const CheckedTensor& t : tensors) check(t, view.stream, "held output");
      if (!replay_.error.empty()) return;
    }
    sample();
  }

  uint64_t peak_used() const { return peak_used_; }
  uint64_t peak_shadow_physical() const { return peak_shadow_; }
  uint64_t peak_graph_reserved() const { return peak_graph_reserved_; }
  const ReplayStats& replay() const { return replay_; }
  // Largest |measured - accounted| over the samples, and the allocation count at that sample.
  int64_t worst_delta() const { return worst_delta_; }

 private:
  void sample() {
    auto o = cuda_.observe();
    if (!o.ok()) return;
    const uint64_t used = free0_ > o->free_bytes ? free0_ - o->free_bytes : 0;
    const uint64_t shadow = cuda_.usage().physical_bytes;
    peak_used_ = std::max(peak_used_, used);
    peak_shadow_ = std::max(peak_shadow_, shadow);
    peak_graph_reserved_ = std::max(peak_graph_reserved_, o->graph_reserved_high);
    const int64_t delta = static_cast<int64_t>(used) - static_cast<int64_t>(shadow);
    if (std::llabs(delta) > std::llabs(worst_delta_)) worst_delta_ = delta;
  }

  void check(const CheckedTensor& t, StreamId stream, const char* what) {
    auto n = cuda_.count_mismatches(t.ptr, t.bytes, t.pattern, stream);
    ++replay_.checks;
    if (!n.ok()) {
      if (replay_.error.empty()) replay_.error = n.error().message;
      return;
    }
    if (*n == 0) return;
    ++replay_.failed_checks;
    replay_.mismatched_words += *n;
    if (replay_.first_failure.empty())
      replay_.first_failure =
          fmt::format("{} {} (b={}): {} words differ", what, t.name, t.batch, *n);
  }

  CudaBackend& cuda_;
  uint64_t free0_;
  bool driver_managed_;  // GraphTraits::driver_managed_memory
  uint64_t seed_;
  uint32_t rounds_;
  uint64_t peak_used_ = 0, peak_shadow_ = 0, peak_graph_reserved_ = 0;
  int64_t worst_delta_ = 0;
  ReplayStats replay_;
};

struct Row {
  std::string strategy, metric;
  double simulated = 0, measured = 0;
  bool ok = true;
  std::string note;
  uint64_t calls = 0;  // us_per_call rows: the real calls measured
};

// calls.csv rows (after the header) of one run's priced calls.
std::string calls_rows(const std::string& label,
                       const std::vector<CudaBackend::CallSample>& calls) {
  std::string rows;
  for (const CudaBackend::CallSample& k : calls)
    if (k.features.priced)
      rows += fmt::format("{},{},{},{},{},{},{:.3f}\n", label, to_string(k.features.p),
                          k.features.handles, k.features.bytes, k.features.nodes,
                          k.features.mappings, double(k.measured_ns) / 1e3);
  return rows;
}

// The nodes a graph body enqueued of its own, as runs of capture sizes with one count ("b1-b8
// 423, b16 407"), and the program's count(s) beside them.
std::string body_node_line(std::vector<CaptureRunResult::BodyNodes> v) {
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.batch < b.batch; });
  std::vector<std::string> runs;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1].body == v[i].body) ++j;
    runs.push_back(i == j ? fmt::format("b{} {}", v[i].batch, v[i].body)
                          : fmt::format("b{}-b{} {}", v[i].batch, v[j].batch, v[i].body));
    i = j + 1;
  }
  std::vector<uint64_t> program;
  for (const auto& b : v)
    if (std::find(program.begin(), program.end(), b.program) == program.end())
      program.push_back(b.program);
  return fmt::format(
      "graph nodes of the step's own work (kernels, copies), per capture size: {}; the "
      "simulation prices the executor program's {} (GPU runs price the graph's)\n",
      fmt::join(runs, ", "), fmt::join(program, "/"));
}

}  // namespace

Status probe_cuda_device() {
  SimClock clock;
  auto created = CudaBackend::create(unpriced_gpu_spec("probe"), clock, nullptr);
  if (!created.ok()) return created.error();
  return {};
}

// The simulated against measured time per call of every primitive class, and their common factor.
void print_per_call(const std::vector<Row>& rows, std::ostream& out) {
  out << "simulated vs measured time per call (us), ratio = measured / simulated; within = "
         "inside 25% (classes of more than 10 calls):\n";
  int counted = 0, within = 0;
  std::vector<double> ratios;  // of the classes counted
  for (const Row& r : rows) {
    if (r.metric.rfind("us_per_call.", 0) != 0) continue;
    const double ratio = r.simulated > 0 ? r.measured / r.simulated : 0.0;
    const bool many = r.calls > 10;
    const bool in = ratio >= 0.75 && ratio <= 1.25;
    counted += many;
    within += many && in;
    if (many) ratios.push_back(ratio);
    out << fmt::format(
        "  {:<26} {:<28} sim {:>10.2f}  measured {:>10.2f}  ratio {:>6.2f}  {:<6} ({})\n",
        r.strategy, r.metric.substr(12), r.simulated, r.measured, ratio,
        !many ? ""
        : in  ? "within"
              : "OUT",
        r.note);
  }
  out << fmt::format("{} of {} primitive classes of more than 10 calls within 25%\n", within,
                     counted);
  out << common_factor_line(ratios);
}

// One recorded strategy run's checks and what they compared.
struct StrategyChecks {
  std::string label;
  const RunRecord* simulated;
  const CaptureRunResult* run;
  const Harness* harness;
  CudaBackend* cuda;
  bool same_bytes, within, replay_ok;
  uint64_t bound, allocations;
  bool driver_managed;
};

// validation.csv's rows of one strategy: accounted bytes, device usage, graph memory, replay
// checks and the time per call of each primitive class.
void add_rows(std::vector<Row>& rows, const StrategyChecks& k) {
  const ReplayStats& rp = k.harness->replay();
  rows.push_back({k.label, "peak_physical_bytes",
                  k.simulated ? static_cast<double>(k.simulated->result.peak_physical) : 0,
                  static_cast<double>(k.run->peak_physical), k.same_bytes,
                  "strategy-accounted bytes, sim run vs CUDA run (must be identical)"});
  rows.push_back({k.label, "peak_strategy_bytes",
                  k.simulated ? static_cast<double>(k.simulated->result.peak_strategy_reserved) : 0,
                  static_cast<double>(k.run->peak_strategy_reserved), k.same_bytes, ""});
  rows.push_back({k.label, "device_usage_bytes",
                  static_cast<double>(k.harness->peak_shadow_physical()),
                  static_cast<double>(k.harness->peak_used()), k.within,
                  fmt::format("cudaMemGetInfo delta; worst |delta| {} vs bound {} ({} allocations "
                              "x granule)",
                              std::llabs(k.harness->worst_delta()), k.bound, k.allocations)});
  if (k.driver_managed)
    rows.push_back({k.label, "graph_mem_reserved_high", static_cast<double>(k.run->peak_graph_mem),
                    static_cast<double>(k.harness->peak_graph_reserved()),
                    k.run->peak_graph_mem == k.harness->peak_graph_reserved(),
                    "shadow driver model vs cudaGraphMemAttrReservedMemHigh"});
  rows.push_back({k.label, "replay_checks", static_cast<double>(rp.checks),
                  static_cast<double>(rp.checks - rp.failed_checks), k.replay_ok,
                  rp.first_failure.empty() ? rp.error : rp.first_failure});
  for (Primitive p : kPerCallTable) {
    const uint64_t n = k.cuda->measured_calls_of(p);
    if (n == 0) continue;
    const double sim_us = static_cast<double>(k.cuda->time_in(p)) / 1000.0 /
                          static_cast<double>(std::max<uint64_t>(1, k.cuda->calls_of(p)));
    const double meas_us =
        static_cast<double>(k.cuda->measured_time_in(p)) / 1000.0 / static_cast<double>(n);
    rows.push_back({k.label, fmt::format("us_per_call.{}", to_string(p)), sim_us, meas_us, true,
                    fmt::format("{} calls", n), n});
  }
}

// graph_body: executor: the executor's model on a backend of its own. Returns 2 (and says
// why) when it cannot be made; a GPU unlike its file's compute section clears all_ok.
int make_executor_body(const ShapesConfig& c, SimClock& clock,
                       std::unique_ptr<CudaBackend>& exec_backend,
                       std::unique_ptr<ExecutorGraphBody>& body, bool& all_ok, std::ostream& out) {
  auto b = CudaBackend::create(c.gpu, clock, nullptr);
  if (!b.ok()) {
    out << "memsim: --backend cuda: " << b.error().message << "\n";
    return 2;
  }
  exec_backend = std::move(b).value();
  auto made = ExecutorGraphBody::create(c.model, c.executor_context, c.kv_block_size,
                                        c.capture_sizes, *exec_backend);
  if (!made.ok()) {
    out << "memsim: --backend cuda: graph_body executor: " << made.error().message << "\n";
    return 2;
  }
  body = std::move(made).value();
  kernels::DeviceLimits lim;
  if (kernels::query_device(&lim) == cudaSuccess &&
      (lim.num_sms != c.gpu.compute.sms ||
       lim.decode_ctas_per_sm != c.gpu.compute.decode_ctas_per_sm)) {
    out << fmt::format(
        "memsim: the GPU file of {} says compute.sms {} and compute.decode_ctas_per_sm {}, this "
        "device has {} and {}: the simulated executor programs plan other split workspaces. "
        "Set them in the GPU YAML.\n",
        c.gpu.name, c.gpu.compute.sms, c.gpu.compute.decode_ctas_per_sm, lim.num_sms,
        lim.decode_ctas_per_sm);
    all_ok = false;
  }
  out << fmt::format(
      "graph body: the executor's decode step ({} weights, graphs for contexts up to {}); the "
      "runner checks every capture's allocations against the executor program op by op\n",
      human_bytes(body->weight_bytes()), c.executor_context);
  return 0;
}

int run_cuda_validation(const ShapesConfig& c, const ShapesResults& sim, OutputDir& dir,
                        std::ostream& out) {
  std::vector<Row> rows;
  const char* header = "strategy,primitive,handles,bytes,nodes,mappings,measured_us\n";
  std::string calls_csv = header;   // every priced real call of the recorded runs
  std::string warmup_csv = header;  // and of the driver warm-up
  bool all_ok = true;
  std::string node_line;  // the first run's body nodes, when a graph body captured
  const uint32_t rounds = c.validation_rounds;
  out << fmt::format("\nCUDA validation ({} variant, {} replay rounds per strategy):\n",
                     c.table.name(), rounds);
  // graph_body: executor: one model (weights, cuBLASLt plans) on a backend of its own, created
  // before any strategy's run so that each run's device usage starts after it.
  SimClock exec_clock;
  std::unique_ptr<CudaBackend> exec_backend;
  std::unique_ptr<ExecutorGraphBody> body;
  if (c.executor_body)
    if (const int rc = make_executor_body(c, exec_clock, exec_backend, body, all_ok, out))
      return rc;
  // Driver warm-up: the first strategy runs once more, first and unrecorded. Whichever strategy
  // a process ran first measured end_capture about twice as slow as strategies run after it
  // (H200, 331-node graphs: shared_pool run first 1151 us per call, run again third 525 us;
  // private_pools run first 1654 us, second 516 us); one run of it, replays and teardown
  // included, takes the driver to the state the later ones see, so every strategy is measured
  // alike.
  std::vector<std::pair<const StrategySpec*, bool>> passes;  // (strategy, recorded)
  if (!c.strategies.empty()) passes.emplace_back(&c.strategies.front(), false);
  for (const StrategySpec& s : c.strategies) passes.emplace_back(&s, true);
  for (const auto& [spec, recorded] : passes) {
    const StrategySpec& s = *spec;
    const RunRecord* simulated = nullptr;
    for (const RunRecord& r : sim.runs)
      if (r.strategy == &s && r.variant == c.table) simulated = &r;
    SimClock clock;
    MetricsRecorder metrics(clock);
    auto created = CudaBackend::create(c.gpu, clock, &metrics);
    if (!created.ok()) {
      out << "memsim: --backend cuda: " << created.error().message << "\n";
      return 2;
    }
    CudaBackend& cuda = **created;
    std::vector<CudaBackend::CallSample> calls;  // the warm-up's too: calls_warmup.csv
    cuda.record_calls(&calls);
    auto o0 = cuda.observe();
    if (!o0.ok()) {
      out << "memsim: --backend cuda: " << o0.error().message << "\n";
      return 2;
    }
    const bool driver_managed = s.traits.driver_managed_memory;
    Harness harness(cuda, o0->free_bytes, driver_managed, c.seed, rounds);
    CaptureRunConfig rc = run_config(c, c.table, nullptr);
    rc.order = s.order;
    rc.order_list = s.order_list;
    rc.observer = &harness;
    if (body) {
      body->attach(&cuda);
      rc.body = body.get();
    }
    auto strategy = s.factory(cuda);
    const CaptureRunResult r = run_captures(rc, cuda, clock, *strategy, metrics);
    strategy.reset();
    if (!r.body_nodes.empty() && node_line.empty()) node_line = body_node_line(r.body_nodes);
    if (!recorded) {
      cuda.record_calls(nullptr);
      warmup_csv += calls_rows(s.label, calls);
      out << fmt::format("driver warm-up: one unrecorded run of {} ({})\n", s.label,
                         r.ok ? "ok" : r.failure);
      out << fmt::format("{:<26} {:>12} {:>12} {:>12} {:>10} {:>9}  {}\n", "strategy", "sim bytes",
                         "cuda bytes", "measured", "delta", "replays", "result");
      continue;
    }
    // Driver-managed graph memory may be mapped at every launch.
    const uint64_t allocations = cuda.calls_of(Primitive::kDeviceMalloc) +
                                 cuda.calls_of(Primitive::kCreatePhysical) +
                                 cuda.calls_of(Primitive::kLaunch) * driver_managed;
    const uint64_t granule = cuda.granularity();
    const bool same_bytes = simulated && simulated->result.peak_physical == r.peak_physical &&
                            simulated->result.peak_strategy_reserved == r.peak_strategy_reserved;
    // Measured: the cudaMemGetInfo delta at the sampled peak versus the accounted bytes.
    const uint64_t bound = granule * std::max<uint64_t>(1, allocations);
    const bool within = static_cast<uint64_t>(std::llabs(harness.worst_delta())) <= bound;
    const ReplayStats& rp = harness.replay();
    const bool replay_ok = rp.error.empty() && rp.failed_checks == 0 && rp.rounds == rounds;
    const bool ok =
        r.ok && r.invariant_violation.empty() && r.released_all && same_bytes && replay_ok;
    all_ok = all_ok && ok;
    std::string verdict = ok ? "ok" : "FAIL";
    if (!r.ok) verdict += ": " + r.failure;
    if (!r.invariant_violation.empty()) verdict += ": " + r.invariant_violation;
    if (!same_bytes) verdict += " (accounted bytes differ from the sim run)";
    if (!rp.error.empty()) verdict += ": replay error: " + rp.error;
    if (!rp.first_failure.empty()) verdict += ": " + rp.first_failure;
    if (!within) verdict += fmt::format(" [usage delta beyond {} granules]", allocations);
    out << fmt::format("{:<26} {:>12} {:>12} {:>12} {:>10} {:>4}/{:<4}  {}\n", s.label,
                       human_bytes(simulated ? simulated->result.peak_physical : 0),
                       human_bytes(r.peak_physical), human_bytes(harness.peak_used()),
                       fmt::format("{:+.1f}M", harness.worst_delta() / 1048576.0),
                       rp.checks - rp.failed_checks, rp.checks, verdict);

    add_rows(rows, {s.label, simulated, &r, &harness, &cuda, same_bytes, within, replay_ok, bound,
                    allocations, driver_managed});
    cuda.record_calls(nullptr);
    calls_csv += calls_rows(s.label, calls);
  }
  dir.write("validation.csv", [&](std::ostream& csv) {
    csv << "strategy,metric,simulated,measured,ratio,ok,note\n";
    for (const Row& r : rows)
      csv << fmt::format("{},{},{:.3f},{:.3f},{:.4f},{},{}\n", csv_cell(r.strategy), r.metric,
                         r.simulated, r.measured, r.simulated > 0 ? r.measured / r.simulated : 0.0,
                         r.ok, csv_quoted(r.note));
  });
  dir.write("calls.csv", calls_csv);
  dir.write("calls_warmup.csv", warmup_csv);
  out << "\n" << node_line;
  print_per_call(rows, out);
  out << docs_footer(kCudaTablesAnchor);
  return all_ok ? 0 : 1;
}

}  // namespace memsim
