// Shapes experiment: YAML loading (validated into ShapesConfig) and the sweep runner.
#include "src/app/shapes_experiment.h"

#include <fmt/format.h>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <memory>
#include <optional>
#include <set>

#include "kernels/attention_types.h"
#include "src/app/writers.h"
#include "src/config/loaders.h"
#include "src/config/requests_loader.h"
#include "src/drivers/trace_recorder.h"
#include "workload/alloc_trace.h"
#include "workload/executor_program.h"
#include "workload/snapshot.h"

namespace memsim {

const ConfigKeys& shapes_config_keys() {
  static const ConfigKeys kKeys = {
      {"", {"experiment",        "gpu",           "model",
            "max_num_seqs",      "capture_sizes", "gemm_workspace",
            "max_model_len",     "kv_block_size", "seed",
            "dynamic",           "sweep",         "table",
            "timeseries",        "strategies",    "graph_body",
            "input_set",         "program",       "export_snapshots",
            "validation_rounds", "grid"}},
      {"dynamic", {"arrivals", "mean_interarrival_us"}},
      {"sweep", {"outputs", "arrival", "graphs", "inputs"}},
      {"table", {"outputs", "arrival", "graphs", "inputs"}},
      {"program", {"source", "files", "pattern"}},
      {"strategies[]", {"label", "order", "order_list"}, "graph_strategies()"},
  };
  return kKeys;
}

std::string Variant::name() const {
  return fmt::format("{}/{}/{}/{}", to_string(outputs), to_string(arrival), to_string(graphs),
                     to_string(inputs));
}

namespace {

const std::vector<std::string> kOutputs = {"strong", "weak"};
const std::vector<std::string> kArrivals = {"fixed", "dynamic"};
const std::vector<std::string> kGraphs = {"full", "piecewise", "both"};
const std::vector<std::string> kInputs = {"per_shape", "persistent"};  // enum order
const std::vector<std::string> kOrders = {"arrival", "large_first", "list"};

template <class E>
E pick(const std::string& s, const std::vector<std::string>& names) {
  return static_cast<E>(std::find(names.begin(), names.end(), s) - names.begin());
}

// An axis: a single value or a list of values, each one of `names`.
std::vector<std::string> axis(const ConfigNode& node, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  if (node.is_sequence()) {
    for (const ConfigNode& item : node.items()) out.push_back(item.as_choice(names));
    if (out.empty()) node.fail("must list at least one value");
  } else {
    out.push_back(node.as_choice(names));
  }
  return out;
}

std::vector<uint32_t> uint_list(const ConfigNode& node, uint32_t lo, uint32_t hi) {
  std::vector<uint32_t> out;
  for (const ConfigNode& item : node.items())
    out.push_back(static_cast<uint32_t>(item.as_uint_in(lo, hi)));
  if (out.empty()) node.fail("must list at least one value");
  return out;
}

Variant load_variant_point(const ConfigNode& node) {
  node.expect_keys(keys_at(shapes_config_keys(), "table"));
  Variant v;
  v.outputs = pick<OutputLifetime>(node["outputs"].as_choice(kOutputs), kOutputs);
  v.arrival = pick<Arrival>(node["arrival"].as_choice(kArrivals), kArrivals);
  v.graphs = pick<GraphRunners>(node["graphs"].as_choice(kGraphs), kGraphs);
  v.inputs = pick<InputBuffers>(node["inputs"].as_choice(kInputs), kInputs);
  return v;
}

StrategySpec load_strategy(const ConfigNode& node, const std::vector<uint32_t>& sizes) {
  if (!node.is_map()) node.fail("each strategy is a map with at least 'impl'");
  const GraphEntry& info =
      graph_strategies().select(node, keys_at(shapes_config_keys(), "strategies[]"));
  const std::string& impl = info.name;
  StrategySpec s;
  s.impl = impl;
  s.traits = info.traits;
  if (auto o = node.find("order")) s.order = pick<CaptureOrder>(o->as_choice(kOrders), kOrders);
  if (auto l = node.find("order_list")) {
    if (s.order != CaptureOrder::kList) l->fail("order_list needs 'order: list'");
    s.order_list = uint_list(*l, 1, 1u << 20);
    std::vector<uint32_t> a = s.order_list, b = sizes;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) l->fail("must be a permutation of the capture sizes");
  } else if (s.order == CaptureOrder::kList) {
    node.fail("'order: list' needs an 'order_list'");
  }
  s.label = node.find("label")                  ? node["label"].as_string()
            : s.order == CaptureOrder::kArrival ? impl
                                                : fmt::format("{}/{}", impl, to_string(s.order));
  s.factory = info.parse(node);
  return s;
}

}  // namespace

ShapesConfig load_shapes_config(const std::string& path,
                                const std::vector<std::string>& overrides) {
  ConfigNode root = ConfigNode::load_file(path);
  for (const std::string& o : overrides) root.apply_override(o);
  return load_shapes_config(root);
}

namespace {

// program: (which graph bodies to capture: generated, or one snapshot per capture size) and the
// capture sizes (program.files' keys, capture_sizes, or vLLM's sizes up to max_num_seqs); each
// snapshot body is read here, once.
void load_program_and_sizes(const ConfigNode& root, ShapesConfig& c) {
  // program: which graph bodies to capture (generated, or one snapshot per capture size).
  std::optional<ConfigNode> files_node;
  std::string pattern;
  if (auto p = root.find("program")) {
    p->expect_keys(keys_at(shapes_config_keys(), "program"));
    if ((*p)["source"].as_choice({"generated", "snapshot"}) == "snapshot") {
      files_node = p->find("files");
      if (auto v = p->find("pattern")) pattern = v->as_string();
      if (files_node.has_value() == !pattern.empty())
        p->fail(
            "source: snapshot needs either files: {BATCH: FILE} or pattern: "
            "\"dir/b{batch}.pickle\"");
      if (!pattern.empty() && pattern.find("{batch}") == std::string::npos)
        (*p)["pattern"].fail("must contain {batch}");
    } else if (p->has("files") || p->has("pattern")) {
      p->fail("files and pattern go with source: snapshot");
    }
  }
  if (files_node && !root.has("capture_sizes") && !root.has("max_num_seqs")) {
    for (const std::string& k : files_node->keys()) {
      uint32_t b = 0;
      const auto [end, err] = std::from_chars(k.data(), k.data() + k.size(), b);
      if (err != std::errc() || end != k.data() + k.size() || b == 0 || b > 65536)
        (*files_node)[k].fail("keys of files are capture sizes (1 to 65536)");
      c.capture_sizes.push_back(b);
    }
  }
  if (!c.capture_sizes.empty()) {
    // capture sizes taken from program.files
  } else if (auto s = root.find("capture_sizes")) {
    if (root.has("max_num_seqs")) (*s).fail("give either capture_sizes or max_num_seqs, not both");
    c.capture_sizes = uint_list(*s, 1, 1u << 16);
    std::set<uint32_t> unique(c.capture_sizes.begin(), c.capture_sizes.end());
    if (unique.size() != c.capture_sizes.size()) s->fail("capture sizes must be distinct");
  } else {
    c.max_num_seqs = static_cast<uint32_t>(root["max_num_seqs"].as_uint_in(1, 1u << 16));
    c.capture_sizes = vllm_capture_sizes(c.max_num_seqs);
  }
  if (files_node || !pattern.empty()) {
    for (uint32_t b : c.capture_sizes) {
      if (files_node) {
        auto f = files_node->find(std::to_string(b));
        if (!f) files_node->fail(fmt::format("no snapshot for capture size {}", b));
        c.snapshot_files[b] = resolve_data_path(*f, f->as_string());
      } else {
        std::string ref = pattern;
        ref.replace(ref.find("{batch}"), 7, std::to_string(b));
        c.snapshot_files[b] = resolve_data_path(root["program"]["pattern"], ref);
      }
    }
    // Each capture size's body from its snapshot, read once here.
    auto programs = std::make_shared<std::map<uint32_t, ShapeProgram>>();
    for (const auto& [b, file] : c.snapshot_files) {
      Result<Snapshot> snap = read_snapshot_file(file);
      Result<AllocTrace> t =
          snap.ok() ? trace_from_snapshot(*snap, 0, file) : Result<AllocTrace>(snap.error());
      if (!t.ok()) root["program"].fail(t.error().message);
      (*programs)[b] = shape_program_from_trace(*t, b);
    }
    c.snapshot_programs = std::move(programs);
  }
}

}  // namespace

ShapesConfig load_shapes_config(const ConfigNode& root) {
  root.expect_keys(keys_at(shapes_config_keys(), ""));
  ShapesConfig c;
  c.source = root.file();
  c.experiment = root["experiment"].as_choice({"shapes"});
  c.gpu = load_gpu_spec(
      ConfigNode::load_file(resolve_config_path(root["gpu"], root["gpu"].as_string(), "gpus")));
  c.model = load_model_shape(ConfigNode::load_file(
      resolve_config_path(root["model"], root["model"].as_string(), "models")));
  // The graphs are captured beside the model's weights: a model that does not fit has no graphs.
  if (c.model.weight_bytes() >= c.gpu.capacity)
    root["model"].fail(fmt::format("the weights of {} ({:.2f} GiB) do not fit the {:.2f} GiB of {}",
                                   c.model.name, double(c.model.weight_bytes()) / (1ull << 30),
                                   double(c.gpu.capacity) / (1ull << 30), c.gpu.name));
  load_program_and_sizes(root, c);
  if (auto v = root.find("gemm_workspace")) c.gemm_workspace_bytes = v->as_bytes();
  if (auto v = root.find("max_model_len"))
    c.max_model_len = static_cast<uint32_t>(v->as_uint_in(1, 1u << 24));
  if (auto v = root.find("kv_block_size"))
    c.kv_block_size = static_cast<uint32_t>(v->as_uint_in(1, 1u << 16));
  if (auto v = root.find("seed")) c.seed = v->as_uint();
  if (auto d = root.find("dynamic")) {
    d->expect_keys(keys_at(shapes_config_keys(), "dynamic"));
    if (auto v = d->find("arrivals"))
      c.dynamic.arrivals = static_cast<uint32_t>(v->as_uint_in(1, 100000000));
    if (auto v = d->find("mean_interarrival_us"))
      c.dynamic.mean_interarrival_us = v->as_double_in(1e-3, 1e12);
  }
  std::vector<std::string> outs = {"strong"}, arr = {"fixed"}, gr = {"full"}, in = {"persistent"};
  if (auto sw = root.find("sweep")) {
    sw->expect_keys(keys_at(shapes_config_keys(), "sweep"));
    if (auto v = sw->find("outputs")) outs = axis(*v, kOutputs);
    if (auto v = sw->find("arrival")) arr = axis(*v, kArrivals);
    if (auto v = sw->find("graphs")) gr = axis(*v, kGraphs);
    if (auto v = sw->find("inputs")) in = axis(*v, kInputs);
  }
  for (const auto& g : gr)
    for (const auto& a : arr)
      for (const auto& o : outs)
        for (const auto& i : in)
          c.variants.push_back(Variant{pick<OutputLifetime>(o, kOutputs),
                                       pick<Arrival>(a, kArrivals), pick<GraphRunners>(g, kGraphs),
                                       pick<InputBuffers>(i, kInputs)});
  if (auto t = root.find("table")) {
    c.table = load_variant_point(*t);
    if (std::find(c.variants.begin(), c.variants.end(), c.table) == c.variants.end())
      t->fail(fmt::format("the table slice {} is not part of the sweep", c.table.name()));
  } else {
    c.table = c.variants.front();
  }
  if (auto v = root.find("export_snapshots")) c.export_snapshots = v->as_bool();
  if (auto t = root.find("timeseries")) c.timeseries_all = t->as_choice({"table", "all"}) == "all";
  if (auto v = root.find("validation_rounds"))
    c.validation_rounds = static_cast<uint32_t>(v->as_uint_in(1, 100000));
  if (!c.snapshot_files.empty()) {
    for (const Variant& v : c.variants)
      if (v.graphs != GraphRunners::kFull)
        root["program"].fail(fmt::format(
            "a snapshot is one graph body per capture size; set sweep.graphs: full (the sweep "
            "has {})",
            to_string(v.graphs)));
    if (root.has("graph_body")) root["graph_body"].fail("graph_body does not apply to snapshots");
  }
  if (auto b = root.find("graph_body")) {
    c.executor_body = b->as_choice({"fill", "executor"}) == "executor";
    if (c.executor_body) {
      for (const Variant& v : c.variants)
        if (v.graphs != GraphRunners::kFull)
          b->fail(
              fmt::format("graph_body: executor captures the whole decode step as one graph; "
                          "set sweep.graphs: full (the sweep has {})",
                          to_string(v.graphs)));
      if (dtype_bytes(c.model.dtype) != 2)
        b->fail("graph_body: executor runs 16-bit models only (model " + c.model.name + ")");
      c.executor_context = graph_context_for(c.max_model_len);
    }
  }
  if (auto v = root.find("input_set")) {
    c.input_set =
        v->as_choice({"program", "xllm"}) == "xllm" ? InputSet::kXllm : InputSet::kProgram;
    if (c.input_set == InputSet::kXllm && c.executor_body)
      v->fail(
          "input_set: xllm needs graph_body: fill (the executor writes its own inputs); set "
          "input_set: program");
  }
  const ConfigNode list = root["strategies"];
  std::set<std::string> labels;
  for (const ConfigNode& s : list.items()) {
    StrategySpec spec = load_strategy(s, c.capture_sizes);
    if (!labels.insert(spec.label).second)
      s.fail(fmt::format("duplicate strategy label '{}' (set 'label' to tell them apart)",
                         spec.label));
    c.strategies.push_back(std::move(spec));
  }
  if (c.strategies.empty()) list.fail("must list at least one strategy");
  return c;
}

kernels::AttentionShape executor_attention_shape(const ModelShape& m) {
  return {m.heads, m.kv_heads, static_cast<uint32_t>(m.head_dim),
          m.dtype == DType::kFP16 ? kernels::KvDtype::kFp16 : kernels::KvDtype::kBf16};
}

CaptureRunConfig run_config(const ShapesConfig& c, const Variant& v, ProgramCache* cache) {
  CaptureRunConfig r;
  r.programs = cache;
  r.model = c.model;
  r.gemm_workspace_bytes = c.gemm_workspace_bytes;
  r.resident_bytes = c.model.weight_bytes();  // the weights stay on the device while capturing
  r.max_model_len = c.max_model_len;
  r.kv_block_size = c.kv_block_size;
  r.capture_sizes = c.capture_sizes;
  r.arrival = v.arrival;
  r.dynamic = c.dynamic;
  r.inputs = v.inputs;
  r.input_set = c.input_set;
  r.outputs = v.outputs;
  r.runners = v.graphs;
  r.seed = c.seed;
  if (c.snapshot_programs) {
    r.program_for = [programs = c.snapshot_programs](uint32_t b) { return programs->at(b); };
    r.gemm_workspace_bytes = 0;
  }
  if (c.executor_body) {
    ExecutorProgramOptions o;
    o.max_context = c.executor_context;
    o.kv_block_size = c.kv_block_size;
    const kernels::AttentionShape shape = executor_attention_shape(c.model);
    const uint32_t ctx = c.executor_context;
    // The split plan of the GPU file's SMs and decode CTAs per SM; the GPU run checks them
    // against the device and its own plan's workspace against this one, op by op.
    const kernels::DeviceLimits limits{c.gpu.compute.sms, c.gpu.compute.decode_ctas_per_sm};
    o.decode_workspace = [shape, ctx, limits](uint32_t b) {
      return kernels::plan_decode_graph(shape, b, ctx, limits).workspace_bytes;
    };
    o.decode_work_words = [shape, ctx, limits](uint32_t b) {
      return kernels::decode_work_words(
          kernels::plan_decode_graph(shape, b, ctx, limits).work_capacity, b);
    };
    r.program_for = [m = c.model, o](uint32_t b) { return make_executor_decode_program(m, b, o); };
    r.gemm_workspace_bytes = 0;
  }
  return r;
}

namespace {

struct SingleRun {
  CaptureRunResult result;
  SampleLog samples;
  std::vector<std::string> names;
};

SingleRun run_one(const ShapesConfig& c, const CaptureRunConfig& rc,
                  const GraphStrategyFactory& factory, bool keep_samples) {
  SimClock clock;
  MetricsRecorder metrics(clock);
  SingleRun out;
  out.result = run_captures_on_sim(rc, c.gpu, factory, clock, metrics);
  if (keep_samples) {
    out.samples = metrics.take_samples();
    for (size_t i = 0; i < metrics.series_count(); ++i)
      out.names.push_back(metrics.name(static_cast<MetricsRecorder::SeriesId>(i)));
  }
  return out;
}

// Footprint of each shape captured alone (fixed arrival, its own inputs) with `factory`.
StandaloneRef standalone(const ShapesConfig& c, const Variant& v,
                         const GraphStrategyFactory& factory, ProgramCache& cache) {
  StandaloneRef ref;
  for (uint32_t b : c.capture_sizes) {
    Variant alone = v;
    alone.arrival = Arrival::kFixed;
    CaptureRunConfig rc = run_config(c, alone, &cache);
    rc.capture_sizes = {b};
    rc.inputs_sized_for = b;
    rc.check_invariants = false;
    const uint64_t bytes = run_one(c, rc, factory, false).result.peak_physical;
    ref.per_shape.emplace_back(b, bytes);
    ref.max = std::max(ref.max, bytes);
    ref.sum += bytes;
  }
  return ref;
}

}  // namespace

ShapesResults run_shapes(const ShapesConfig& c) {
  const auto t0 = std::chrono::steady_clock::now();
  ShapesResults out;
  ProgramCache cache;
  // The reference footprint of a shape: captured alone into a fresh private pool.
  const GraphStrategyFactory private_pools = graph_strategies().find("private_pools")->defaults();
  for (const Variant& v : c.variants) {
    const StandaloneRef ref = standalone(c, v, private_pools, cache);
    out.references.emplace_back(v, ref);
    for (const StrategySpec& s : c.strategies) {
      CaptureRunConfig rc = run_config(c, v, &cache);
      rc.order = s.order;
      rc.order_list = s.order_list;
      // The table slice's allocator timeline, recorded as a PyTorch snapshot on request.
      const bool record = c.export_snapshots && v == c.table;
      auto recorder = record ? std::make_shared<TimelineRecorder>() : nullptr;
      bool observed = false;
      GraphStrategyFactory factory = s.factory;
      if (record)
        factory = [f = s.factory, recorder, &observed](Backend& b) {
          auto strategy = f(b);
          observed = strategy->set_observer(recorder.get());
          return strategy;
        };
      SingleRun one = run_one(c, rc, factory, c.timeseries_all || v == c.table);
      if (observed) {
        Result<std::string> bytes = serialize_snapshot(recorder->snapshot());
        if (bytes.ok()) out.snapshots.emplace_back(s.label, std::move(*bytes));
        const CaptureRunResult& r = one.result;
        if (r.peak_virtual_mapped > r.peak_physical)
          out.snapshot_notes.push_back(fmt::format(
              "{}: its snapshot shows the allocator's segments in every VA range; they share "
              "physical pages ({} mapped, {} physical at peak), so memory_viz's reserved "
              "overstates the device's memory",
              s.label, human_bytes(r.peak_virtual_mapped), human_bytes(r.peak_physical)));
      } else if (record) {
        out.snapshot_notes.push_back(fmt::format(
            "{}: not exported (no allocator holds its graph memory, so there is no timeline)",
            s.label));
      }
      RunRecord rec;
      rec.strategy = &s;
      rec.variant = v;
      rec.result = std::move(one.result);
      rec.reference_max = ref.max;
      rec.reference_sum = ref.sum;
      // A pool strategy captures one shape alone exactly as a fresh private pool does; the
      // driver's footprint of a shape alone is its own.
      rec.own_max =
          s.traits.driver_managed_memory ? standalone(c, v, s.factory, cache).max : ref.max;
      const auto run_index = static_cast<uint32_t>(out.runs.size());
      for (const auto& sample : one.samples)
        out.timeseries.push_back(
            TimeseriesRow{sample.time, run_index, one.names[sample.series], sample.value});
      out.runs.push_back(std::move(rec));
    }
  }
  out.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace memsim
