// memsim replay: snapshot -> allocation trace -> one replay per allocator -> reports.
#include "src/app/replay_command.h"

#include <filesystem>
#include <fstream>
#include <ostream>

#include <fmt/format.h>

#include "backends/sim/sim_backend.h"
#include "sim/clock.h"
#include "sim/trace_recorder.h"
#include "sim/trace_replay.h"
#include "sim/workload/alloc_trace.h"
#include "sim/workload/snapshot.h"
#include "src/alloc/registry.h"
#include "src/app/writers.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"

namespace memsim {

namespace fs = std::filesystem;

namespace {

constexpr int kExitRunFailure = 1;
constexpr int kExitConfigError = 2;

struct AllocatorRun {
  std::string name;
  std::string config_yaml;  // the resolved keys, for summary.json
  ReplayOutcome outcome;
  uint64_t min_capacity = 0;  // 0 = not computed or does not fit the GPU
};

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The allocators' YAML: torch_caching starts from the snapshot's own settings, the others from
// their defaults; --set NAME.key=value overrides go on top and are validated like any config.
Result<std::vector<std::pair<std::string, AllocatorFactory>>> resolve_allocators(
    const ReplayCommandOptions& o, const Snapshot& snap, std::vector<std::string>* yaml_out) {
  std::vector<std::string> names = o.allocators;
  if (names.empty()) names = caching_allocator_names();
  const std::vector<std::string> known = caching_allocator_names();
  std::string doc = "allocators:\n";
  for (const std::string& n : names) {
    if (find_caching_allocator(n) == nullptr) {
      const std::string close = closest_match(n, known);
      return make_error(
          ErrorCode::kInvalidArgument,
          fmt::format("--allocator {}: unknown allocator{} (known: {})", n,
                      close.empty() ? "" : fmt::format(" (did you mean '{}'?)", close),
                      fmt::join(known, ", ")));
    }
    doc += fmt::format("  {}: {}\n", n,
                       n == "torch_caching" ? torch_caching_yaml(snap.settings) : "{}");
  }
  std::vector<std::pair<std::string, AllocatorFactory>> out;
  try {
    ConfigNode root = ConfigNode::parse(doc, "memsim replay");
    for (const std::string& a : o.overrides) {
      const auto dot = a.find('.');
      const std::string who = a.substr(0, dot == std::string::npos ? 0 : dot);
      if (dot == std::string::npos || a.find('=') == std::string::npos || a.find('=') < dot)
        throw ConfigError(fmt::format(
            "--set {}: expected ALLOCATOR.key=value (e.g. torch_caching.max_split_size=64MiB)", a));
      if (std::find(names.begin(), names.end(), who) == names.end()) {
        const std::string close = closest_match(who, names);
        throw ConfigError(
            fmt::format("--set {}: '{}' is not an allocator of this replay{}", a, who,
                        close.empty() ? "" : fmt::format(" (did you mean '{}'?)", close)));
      }
      root.apply_override("allocators." + a);
    }
    const ConfigNode all = root["allocators"];
    for (const std::string& n : names) {
      const ConfigNode node = all[n];
      const AllocatorInfo* info = find_caching_allocator(n);
      node.expect_keys(info->params);
      out.emplace_back(n, info->parse(node));
      YAML::Emitter e;
      e << YAML::Flow << node.raw();
      yaml_out->push_back(e.c_str());
    }
  } catch (const ConfigError& e) {
    return make_error(ErrorCode::kInvalidArgument, e.what());
  }
  return out;
}

std::string write_outputs(const std::string& dir, const ReplayCommandOptions& o,
                          const AllocTrace& trace, const Snapshot& snap,
                          const std::vector<AllocatorRun>& runs, uint64_t recorded_peak) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fmt::format("cannot create {}: {}", dir, ec.message());
  std::ofstream js(fs::path(dir) / "summary.json");
  js << "{\n";
  js << fmt::format("  \"snapshot\": {},\n  \"device\": {},\n  \"ops\": {},\n  \"streams\": {},\n",
                    json_str(o.snapshot), o.device, trace.ops.size(), trace.streams);
  js << fmt::format("  \"initial_segments\": {},\n", trace.initial.size());
  js << fmt::format(
      "  \"recorded\": {{\"allocator_settings\": {}, \"peak_reserved_bytes\": {}, "
      "\"final_reserved_bytes\": {}, \"ooms\": {}, \"expandable_segments\": {}}},\n",
      json_str(snap.settings.conf), recorded_peak,
      trace.recorded_reserved.empty() ? trace.recorded_initial_reserved
                                      : trace.recorded_reserved.back(),
      trace.recorded_ooms, trace.recorded_expandable ? "true" : "false");
  js << "  \"runs\": [\n";
  for (size_t k = 0; k < runs.size(); ++k) {
    const AllocatorRun& r = runs[k];
    const ReplayOutcome& x = r.outcome;
    js << fmt::format(
        "    {{\"allocator\": {}, \"config\": {}, \"peak_allocated_bytes\": {}, "
        "\"peak_reserved_bytes\": {}, \"fragmentation_at_peak\": {:.6f}, "
        "\"device_alloc_calls\": {}, \"min_capacity_bytes\": {}, \"oom\": {}, \"error\": {}, "
        "\"ops_done\": {}, \"backend_time_us\": {:.3f}, \"matches_recorded\": {}, "
        "\"first_mismatch_op\": {}}}{}\n",
        json_str(r.name), json_str(r.config_yaml), x.peak_allocated, x.peak_reserved,
        x.fragmentation_at_peak(), x.device_alloc_calls,
        r.min_capacity == 0 ? "null" : std::to_string(r.min_capacity), x.oom ? "true" : "false",
        json_str(x.error), x.ops_done, static_cast<double>(x.backend_ns) / 1e3,
        x.error.empty() && !x.first_mismatch ? "true" : "false",
        x.first_mismatch ? std::to_string(*x.first_mismatch) : "null",
        k + 1 < runs.size() ? "," : "");
  }
  js << "  ]\n}\n";
  if (!js) return "cannot write summary.json";
  std::ofstream ts(fs::path(dir) / "timeseries.csv");
  ts << "allocator,op,time_us,allocated_bytes,requested_bytes,reserved_bytes\n";
  for (size_t k = 0; k < trace.recorded_reserved.size(); ++k)
    ts << fmt::format("recorded,{},{},,,{}\n", k, trace.ops[k].time_us, trace.recorded_reserved[k]);
  for (const AllocatorRun& r : runs)
    for (const ReplaySample& s : r.outcome.series)
      ts << fmt::format("{},{},{},{},{},{}\n", r.name, s.op, s.time_us, s.allocated, s.requested,
                        s.reserved);
  if (!ts) return "cannot write timeseries.csv";
  // The program itself, for replaying it elsewhere (tools/torch_replay.py on a GPU).
  std::ofstream ops(fs::path(dir) / "ops.csv");
  ops << "op,kind,id,bytes,stream,time_us\n";
  for (const auto& seg : trace.initial)
    for (const auto& b : seg.blocks)
      ops << fmt::format("-1,initial,{},{},{},0\n", b.id, b.requested, seg.stream);
  for (size_t k = 0; k < trace.ops.size(); ++k) {
    const TraceOp& op = trace.ops[k];
    const char* kind = op.kind == TraceOp::Kind::kAlloc  ? "alloc"
                       : op.kind == TraceOp::Kind::kFree ? "free"
                                                         : "empty_cache";
    ops << fmt::format("{},{},{},{},{},{}\n", k, kind, op.id, op.bytes, op.stream, op.time_us);
  }
  if (!ops) return "cannot write ops.csv";
  return {};
}

}  // namespace

int run_replay_command(const ReplayCommandOptions& o, std::ostream& out, std::ostream& err) {
  Result<Snapshot> snap = read_snapshot_file(o.snapshot);
  if (!snap.ok()) {
    err << "memsim replay: " << snap.error().message << "\n";
    return kExitConfigError;
  }
  Result<AllocTrace> trace = trace_from_snapshot(*snap, o.device, o.snapshot);
  if (!trace.ok()) {
    err << "memsim replay: " << trace.error().message << "\n";
    return kExitConfigError;
  }
  GpuSpec gpu;
  try {
    // A bare name is looked up under MEMSIM_ROOT, the current folder, and the source tree of
    // this binary (build/memsim -> configs/gpus/NAME.yaml).
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    const std::string anchor =
        ec ? std::string("memsim replay --gpu")
           : (exe.parent_path() / ".." / "experiments" / "memsim replay --gpu").string();
    const ConfigNode ref = ConfigNode::parse("gpu: '" + o.gpu + "'", anchor);
    gpu = load_gpu_spec(ConfigNode::load_file(resolve_config_path(ref["gpu"], o.gpu, "gpus")));
  } catch (const ConfigError& e) {
    err << "memsim replay: --gpu: " << e.what() << "\n";
    return kExitConfigError;
  }
  std::vector<std::string> yamls;
  auto allocs = resolve_allocators(o, *snap, &yamls);
  if (!allocs.ok()) {
    err << "memsim replay: " << allocs.error().message << "\n";
    return kExitConfigError;
  }
  const AllocTrace& t = *trace;
  uint64_t recorded_peak = t.recorded_initial_reserved;
  for (uint64_t r : t.recorded_reserved) recorded_peak = std::max(recorded_peak, r);

  out << fmt::format(
      "memsim replay: {} (device {}: {} ops, {} streams, {} segments live when "
      "recording began)\n",
      o.snapshot, o.device, t.ops.size(), t.streams, t.initial.size());
  out << fmt::format("recorded by PyTorch: peak reserved {}, final reserved {}{}{}\n",
                     human_bytes(recorded_peak),
                     human_bytes(t.recorded_reserved.empty() ? t.recorded_initial_reserved
                                                             : t.recorded_reserved.back()),
                     snap->settings.conf.empty()
                         ? ""
                         : fmt::format(", PYTORCH_CUDA_ALLOC_CONF='{}'", snap->settings.conf),
                     t.recorded_ooms ? fmt::format(", {} OOMs", t.recorded_ooms) : "");
  if (t.graph_pool_segments > 0)
    out << fmt::format(
        "note: {} segments belong to CUDA-graph private pools; the trace does not "
        "say which allocations went there, so they replay in the default pool\n",
        t.graph_pool_segments);

  std::vector<AllocatorRun> runs;
  bool failed = false;
  for (size_t k = 0; k < allocs->size(); ++k) {
    const auto& [name, factory] = (*allocs)[k];
    SimClock clock;
    SimBackend backend(gpu, clock);
    auto alloc = factory(backend);
    Result<ReplayOutcome> r = replay_trace(t, *alloc, backend);
    if (!r.ok()) {
      err << "memsim replay: " << name << ": " << r.error().message << "\n";
      return kExitConfigError;
    }
    AllocatorRun run{name, yamls[k], std::move(*r), 0};
    if (!run.outcome.error.empty() && !run.outcome.oom) failed = true;
    if (o.min_capacity && run.outcome.error.empty())
      run.min_capacity = min_capacity(t, factory, gpu, run.outcome.peak_allocated,
                                      std::max(run.outcome.peak_reserved, gpu.granularity));
    runs.push_back(std::move(run));
  }

  out << fmt::format("{:<18} {:>12} {:>14} {:>10} {:>10} {:>13}  {}\n", "allocator", "peak alloc",
                     "peak reserved", "frag@peak", "dev allocs", "min capacity", "vs recorded");
  out << fmt::format("{:<18} {:>12} {:>14} {:>10} {:>10} {:>13}  {}\n", "(recorded)", "",
                     human_bytes(recorded_peak), "", "", "", "");
  for (const AllocatorRun& r : runs) {
    const ReplayOutcome& x = r.outcome;
    std::string vs;
    if (!x.error.empty()) {
      vs = fmt::format("{} at op {}: {}", x.oom ? "OOM" : "FAILED", x.failed_op, x.error);
    } else if (!x.first_mismatch) {
      vs = fmt::format("reserved equal after all {} ops", t.ops.size());
    } else {
      vs = fmt::format(
          "peak {:.2f}x{}",
          static_cast<double>(x.peak_reserved) /
              static_cast<double>(std::max<uint64_t>(recorded_peak, 1)),
          r.name == "torch_caching" ? fmt::format(", differs from op {}", *x.first_mismatch) : "");
    }
    out << fmt::format("{:<18} {:>12} {:>14} {:>9.1f}% {:>10} {:>13}  {}\n", r.name,
                       human_bytes(x.peak_allocated), human_bytes(x.peak_reserved),
                       100.0 * x.fragmentation_at_peak(), x.device_alloc_calls,
                       r.min_capacity ? human_bytes(r.min_capacity) : "-", vs);
  }
  if (snap->settings.garbage_collection_threshold > 0 &&
      std::none_of(o.overrides.begin(), o.overrides.end(), [](const std::string& a) {
        return a.rfind("torch_caching.memory_limit=", 0) == 0;
      }))
    out << "note: the recording set garbage_collection_threshold, which acts only under "
           "set_per_process_memory_fraction; the snapshot does not record the fraction, so "
           "torch_caching collected nothing: pass --set torch_caching.memory_limit=BYTES "
           "(fraction x device memory)\n";

  const std::string dir = (fs::path(o.out_dir) / "replay").string();
  if (std::string e = write_outputs(dir, o, t, *snap, runs, recorded_peak); !e.empty()) {
    err << "memsim replay: " << e << "\n";
    return kExitRunFailure;
  }
  out << fmt::format("wrote {}/summary.json, {}/timeseries.csv, {}/ops.csv\n", dir, dir, dir);
  if (!o.export_path.empty()) {
    auto it = std::find_if(allocs->begin(), allocs->end(),
                           [](const auto& a) { return a.first == "torch_caching"; });
    const auto& factory = it != allocs->end() ? it->second : allocs->front().second;
    Result<std::string> bytes = export_replay_snapshot(t, factory, gpu);
    if (!bytes.ok()) {
      err << "memsim replay: --export: " << bytes.error().message << "\n";
      return kExitRunFailure;
    }
    std::ofstream f(o.export_path, std::ios::binary);
    f << *bytes;
    if (!f) {
      err << "memsim replay: --export: cannot write " << o.export_path << "\n";
      return kExitRunFailure;
    }
    out << "exported " << (it != allocs->end() ? it->first : allocs->front().first)
        << "'s replay as a snapshot: " << o.export_path << " (open it in pytorch.org/memory_viz)\n";
  }
  out << run_plot_script(o.snapshot, "plot_replay.py", dir, {}, {"replay.png"}) << "\n";
  return failed ? kExitRunFailure : 0;
}

}  // namespace memsim
