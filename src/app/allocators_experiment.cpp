// Allocators experiment: config loading, generated serving traces, replays, outputs.
#include "src/app/allocators_experiment.h"

#include <filesystem>
#include <ostream>
#include <random>

#include <fmt/format.h>

#include "src/app/allocator_reports.h"
#include "src/app/plots.h"
#include "src/app/writers.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/config/requests_loader.h"
#include "workload/executor_program.h"
#include "workload/snapshot.h"

namespace memsim {

namespace fs = std::filesystem;

const ConfigKeys& allocators_config_keys() {
  static const ConfigKeys kKeys = {
      {"",
       {"experiment", "gpu", "model", "workloads", "allocators", "seed", "min_capacity", "grid"}},
      {"workloads[source: generated]",
       {"label", "source", "steps", "max_batch", "prefill_chunk", "prefill_probability",
        "max_context"}},
      {"workloads[source: snapshot]", {"label", "source", "path"}},
      {"allocators[]", {"label"}, "caching_allocators()"},
  };
  return kKeys;
}

bool is_allocators_config(const ConfigNode& root) {
  return root.is_map() && root.has("workloads");
}

bool is_allocators_config(const std::string& path) {
  try {
    const ConfigNode root = ConfigNode::load_file(path);
    return root.is_map() && root.has("workloads");
  } catch (const ConfigError&) {
    return false;
  }
}

AllocatorsConfig load_allocators_config(const std::string& path,
                                        const std::vector<std::string>& overrides) {
  ConfigNode root = ConfigNode::load_file(path);
  for (const std::string& o : overrides) root.apply_override(o);
  return load_allocators_config(root);
}

AllocatorsConfig load_allocators_config(const ConfigNode& root) {
  const ConfigKeys& keys = allocators_config_keys();
  root.expect_keys(keys_at(keys, ""));
  AllocatorsConfig c;
  c.source = root.file();
  if (auto v = root.find("experiment")) c.experiment = v->as_plain_name();
  c.gpu = load_gpu_spec(
      ConfigNode::load_file(resolve_config_path(root["gpu"], root["gpu"].as_string(), "gpus")));
  c.model = load_model_shape(ConfigNode::load_file(
      resolve_config_path(root["model"], root["model"].as_string(), "models")));
  if (auto v = root.find("seed")) c.seed = v->as_uint();
  if (auto v = root.find("min_capacity")) c.min_capacity = v->as_bool();
  for (const ConfigNode& w : root["workloads"].items()) {
    AllocWorkload wl;
    wl.label = w["label"].as_string();
    const std::string src = w["source"].as_choice({"generated", "snapshot"});
    if (src == "snapshot") {
      w.expect_keys(keys_at(keys, "workloads[source: snapshot]"));
      wl.snapshot = true;
      wl.path = resolve_data_path(w["path"], w["path"].as_string());
    } else {
      w.expect_keys(keys_at(keys, "workloads[source: generated]"));
      GeneratedServing& g = wl.serving;
      if (auto v = w.find("steps")) g.steps = static_cast<uint32_t>(v->as_uint_in(1, 1000000));
      if (auto v = w.find("max_batch")) g.max_batch = static_cast<uint32_t>(v->as_uint_in(1, 8192));
      if (auto v = w.find("prefill_chunk"))
        g.prefill_chunk = static_cast<uint32_t>(v->as_uint_in(0, 65536));
      if (auto v = w.find("prefill_probability")) g.prefill_probability = v->as_double_in(0, 1);
      if (auto v = w.find("max_context"))
        g.max_context = static_cast<uint32_t>(v->as_uint_in(16, 1u << 20));
    }
    c.workloads.push_back(std::move(wl));
  }
  if (c.workloads.empty()) root["workloads"].fail("needs at least one workload");
  for (const ConfigNode& a : root["allocators"].items()) {
    AllocatorSpec spec;
    const AllocatorEntry& info = caching_allocators().select(a, keys_at(keys, "allocators[]"));
    spec.impl = info.name;
    spec.label = a.has("label") ? a["label"].as_string() : spec.impl;
    spec.factory = info.parse(a);
    YAML::Emitter e;
    e << YAML::Flow << a.raw();
    spec.yaml = e.c_str();
    c.allocators.push_back(std::move(spec));
  }
  if (c.allocators.empty()) root["allocators"].fail("needs at least one allocator");
  return c;
}

AllocTrace generate_serving_trace(const ModelShape& model, const GeneratedServing& g, uint64_t seed,
                                  const std::string& label) {
  AllocTrace t;
  t.source = label;
  std::mt19937_64 rng(seed);
  auto uniform = [&](uint32_t lo, uint32_t hi) {
    return static_cast<uint32_t>(std::uniform_int_distribution<uint32_t>(lo, hi)(rng));
  };
  uint32_t batch = std::max(1u, g.max_batch / 4);
  std::vector<uint32_t> held_inputs;  // the previous step's input ids (async scheduling)
  int64_t time = 0;
  auto alloc = [&](uint64_t bytes) {
    TraceOp op;
    op.kind = TraceOp::Kind::kAlloc;
    op.id = t.blocks++;
    op.bytes = bytes;
    op.time_us = time++;
    t.ops.push_back(op);
    return op.id;
  };
  auto free = [&](uint32_t id) {
    TraceOp op;
    op.kind = TraceOp::Kind::kFree;
    op.id = id;
    op.time_us = time++;
    t.ops.push_back(op);
  };
  for (uint32_t s = 0; s < g.steps; ++s) {
    // Decode batch: a random walk (requests finish and arrive); sometimes a prefill chunk.
    const int step = static_cast<int>(uniform(0, 16)) - 8;
    batch = static_cast<uint32_t>(std::clamp<int64_t>(int64_t{batch} + step, 1, g.max_batch));
    uint32_t tokens = batch;
    if (g.prefill_chunk > 0 &&
        std::uniform_real_distribution<double>(0, 1)(rng) < g.prefill_probability)
      tokens += uniform(1, g.prefill_chunk);
    const uint32_t context = uniform(std::min(128u, g.max_context), g.max_context);
    ExecutorProgramOptions po;
    po.max_context = context;
    // Split-KV partial outputs: per token and head, one fp32 row of head_dim and its LSE per
    // split, with a split per 2048 tokens of context, at most 16 (the decode kernel's plan).
    const uint64_t splits = std::min<uint64_t>(16, (context + 2047) / 2048);
    po.decode_workspace = [&model, splits](uint32_t b) {
      return splits <= 1 ? 0 : uint64_t{b} * model.heads * splits * (model.head_dim * 4 + 4);
    };
    const ShapeProgram p = make_executor_decode_program(model, tokens, po);
    std::vector<uint32_t> inputs;
    for (const TensorSpec& in : p.inputs) inputs.push_back(alloc(in.bytes));
    for (const GraphProgram& graph : p.graphs) {
      std::vector<uint32_t> ids(graph.tensors.size(), UINT32_MAX);
      for (const ProgramOp& op : graph.ops) {
        if (op.kind == ProgramOp::Kind::kAlloc) {
          ids[op.tensor] = alloc(graph.tensors[op.tensor].bytes);
        } else {
          free(ids[op.tensor]);
          ids[op.tensor] = UINT32_MAX;
        }
      }
      for (uint32_t id : ids)
        if (id != UINT32_MAX) free(id);  // tensors the graph keeps end with the step
    }
    for (uint32_t id : held_inputs) free(id);
    held_inputs = std::move(inputs);
  }
  for (uint32_t id : held_inputs) free(id);
  return t;
}

int run_allocators_experiment(const AllocatorsConfig& c, OutputDir& dir, std::ostream& out,
                              std::ostream& err, bool explain) {
  std::vector<AllocTrace> traces;
  for (size_t k = 0; k < c.workloads.size(); ++k) {
    const AllocWorkload& w = c.workloads[k];
    if (!w.snapshot) {
      traces.push_back(generate_serving_trace(c.model, w.serving, c.seed + k, w.label));
      continue;
    }
    Result<Snapshot> s = read_snapshot_file(w.path);
    Result<AllocTrace> t =
        s.ok() ? trace_from_snapshot(*s, 0, w.path) : Result<AllocTrace>(s.error());
    if (!t.ok()) {
      err << "memsim: workload " << w.label << ": " << t.error().message << "\n";
      return 2;
    }
    traces.push_back(std::move(*t));
  }
  out << fmt::format("{}: {} workloads x {} allocators on {} ({}), model {}\n", c.experiment,
                     c.workloads.size(), c.allocators.size(), c.gpu.name,
                     human_bytes(c.gpu.capacity), c.model.name);
  std::vector<AllocatorRunRecord> runs;
  bool failed = false;
  for (size_t k = 0; k < c.workloads.size(); ++k) {
    for (const AllocatorSpec& a : c.allocators) {
      Result<AllocatorRunRecord> r = run_allocator(traces[k], c.workloads[k].label, a.label, a.yaml,
                                                   a.factory, c.gpu, c.min_capacity);
      if (!r.ok()) {
        err << "memsim: " << c.workloads[k].label << " / " << a.label << ": " << r.error().message
            << "\n";
        return 1;
      }
      if (!r->outcome.error.empty() && !r->outcome.oom) failed = true;
      runs.push_back(std::move(*r));
    }
  }
  out << format_allocator_table(runs, true, explain);
  dir.write("summary.json", [&](std::ostream& js) {
    js << fmt::format(
        "{{\n  \"experiment\": \"{}\",\n  \"config\": \"{}\",\n  \"gpu\": \"{}\",\n"
        "  \"model\": \"{}\",\n  \"seed\": {},\n  \"workloads\": [",
        json_escape(c.experiment), json_escape(c.source), json_escape(c.gpu.name),
        json_escape(c.model.name), c.seed);
    for (size_t k = 0; k < traces.size(); ++k)
      js << fmt::format(
          "{}{{\"label\": \"{}\", \"ops\": {}, \"recorded_peak_reserved_bytes\": {}}}",
          k ? ", " : "", json_escape(c.workloads[k].label), traces[k].ops.size(),
          recorded_peak(traces[k]));
    js << "],\n  \"runs\": [\n" << allocator_runs_json(runs) << "  ]\n}\n";
  });
  dir.write("timeseries.csv", [&](std::ostream& ts) {
    std::vector<std::pair<std::string, const AllocTrace*>> named;
    for (size_t k = 0; k < traces.size(); ++k) named.emplace_back(c.workloads[k].label, &traces[k]);
    write_allocator_timeseries(ts, runs, named);
  });
  dir.add_note(
      run_plot_script("plot_allocators.py", dir, {}, {"allocators.png", "allocators.svg"}));
  return failed ? 1 : 0;
}

}  // namespace memsim
