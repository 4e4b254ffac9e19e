// memsim replay: snapshot -> allocation trace -> one replay per allocator -> reports.
#include "src/app/replay_command.h"

#include <algorithm>
#include <filesystem>
#include <new>
#include <ostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/host_memory.h"
#include "memsim_config.h"
#include "src/alloc/registry.h"
#include "src/app/allocator_reports.h"
#include "src/app/cuda_modes.h"
#include "src/app/output.h"
#include "src/app/plots.h"
#include "src/app/writers.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/drivers/trace_recorder.h"
#include "src/drivers/trace_replay.h"
#include "workload/alloc_trace.h"
#include "workload/snapshot.h"

namespace memsim {

namespace fs = std::filesystem;

namespace {

constexpr int kExitRunFailure = 1;
constexpr int kExitConfigError = 2;

// One replayed allocator: its label (the name, then every option given on the command line),
// its registered name, and its resolved keys.
struct ReplayVariant {
  std::string label;
  std::string name;
  std::string yaml;  // flow YAML of its resolved keys
  AllocatorFactory factory;
};

// `NAME[:KEY=VALUE[,KEY=VALUE...]]` split into NAME and its assignments (commas inside [] or {}
// belong to a value: roundup_power2_divisions={256MiB: 1, '>': 8}).
std::pair<std::string, std::vector<std::string>> split_variant(const std::string& spec) {
  const auto colon = spec.find(':');
  std::pair<std::string, std::vector<std::string>> out{spec.substr(0, colon), {}};
  if (colon == std::string::npos) return out;
  int depth = 0;
  std::string cur;
  for (char ch : spec.substr(colon + 1)) {
    depth += (ch == '[' || ch == '{') - (ch == ']' || ch == '}');
    if (ch == ',' && depth == 0) {
      out.second.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.second.push_back(cur);
  return out;
}

// Checks one `key=value` given by `flag` for allocator `info`: the key must be one of its keys.
void check_assignment(const std::string& flag, const std::string& a, const AllocatorEntry& info) {
  const auto eq = a.find('=');
  if (eq == 0 || eq == std::string::npos || eq + 1 == a.size())
    throw ConfigError(fmt::format("{}: '{}' is not KEY=VALUE (e.g. {})", flag, a,
                                  "torch_caching:expandable_segments=true,max_split_size=64MiB"));
  const std::string key = a.substr(0, std::min(eq, a.find('.')));
  if (std::find(info.keys.begin(), info.keys.end(), key) == info.keys.end()) {
    const std::string close = closest_match(key, info.keys);
    throw ConfigError(fmt::format("{}: '{}' is not a key of {} ({})", flag, key, info.name,
                                  close.empty()
                                      ? fmt::format("valid keys: {}", fmt::join(info.keys, ", "))
                                      : fmt::format("did you mean '{}'?", close)));
  }
}

// The options as they take effect, in the order first given: a later KEY=VALUE replaces an
// earlier one of the same key (a variant's own after --set).
std::vector<std::string> effective(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& a : given) {
    const std::string key = a.substr(0, a.find('='));
    auto same = std::find_if(out.begin(), out.end(),
                             [&](const std::string& b) { return b.substr(0, b.find('=')) == key; });
    if (same != out.end())
      *same = a;
    else
      out.push_back(a);
  }
  return out;
}

// The variants' YAML: those configured by PyTorch's settings (torch_caching) start from the
// snapshot's own, the others from their defaults; --set NAME.key=value goes on top of every
// variant of NAME, then the variant's own options; each is validated like any config.
Result<std::vector<ReplayVariant>> resolve_allocators(const ReplayCommandOptions& o,
                                                      const Snapshot& snap) {
  const Registry<AllocatorEntry>& registry = caching_allocators();
  std::vector<std::string> specs = o.allocators;
  if (specs.empty()) specs = registry.names();
  std::vector<ReplayVariant> out;
  try {
    std::vector<std::string> names;
    std::vector<std::vector<std::string>> options;
    std::string doc = "variants:\n";
    for (const std::string& spec : specs) {
      auto [name, assignments] = split_variant(spec);
      const AllocatorEntry* info = registry.find(name);
      if (info == nullptr)
        throw ConfigError(fmt::format("--allocator {}: {}", spec, registry.unknown(name)));
      for (const std::string& a : assignments) check_assignment("--allocator " + spec, a, *info);
      doc += fmt::format(
          "  - {}\n", info->traits.pytorch_alloc_conf ? torch_caching_yaml(snap.settings) : "{}");
      names.push_back(name);
      options.push_back(std::move(assignments));
    }
    ConfigNode root = ConfigNode::parse(doc, "memsim replay");
    std::vector<std::vector<std::string>> sets(names.size());
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
      check_assignment("--set " + a, a.substr(dot + 1), *registry.find(who));
      for (size_t k = 0; k < names.size(); ++k)
        if (names[k] == who) sets[k].push_back(a.substr(dot + 1));
    }
    for (size_t k = 0; k < names.size(); ++k) {
      std::vector<std::string> given = sets[k];
      given.insert(given.end(), options[k].begin(), options[k].end());
      given = effective(given);
      for (const std::string& a : given) root.apply_override(fmt::format("variants.{}.{}", k, a));
      const ConfigNode node = root["variants"].items()[k];
      const AllocatorEntry* info = registry.find(names[k]);
      node.expect_keys(info->keys);
      ReplayVariant v{names[k], names[k], {}, {}};
      for (size_t i = 0; i < given.size(); ++i) v.label += (i == 0 ? ":" : ",") + given[i];
      try {
        v.factory = info->parse(node);
      } catch (const ConfigError& e) {  // name the row, not the YAML built for it
        std::string why = e.what();
        const std::string built = fmt::format("memsim replay (--set variants[{}].", k);
        if (why.rfind(built, 0) == 0)
          why = v.label + " (" + v.name + "." + why.substr(built.size());
        throw ConfigError(why);
      }
      YAML::Emitter e;
      e << YAML::Flow << node.raw();
      v.yaml = e.c_str();
      for (const ReplayVariant& w : out)
        if (w.label == v.label) throw ConfigError("--allocator " + v.label + " is given twice");
      out.push_back(std::move(v));
    }
  } catch (const ConfigError& e) {
    return make_error(ErrorCode::kInvalidArgument, e.what());
  }
  return out;
}

void write_outputs(OutputDir& dir, const ReplayCommandOptions& o, const AllocTrace& trace,
                   const Snapshot& snap, const std::vector<AllocatorRunRecord>& runs) {
  dir.write("summary.json", [&](std::ostream& js) {
    js << "{\n";
    js << fmt::format(
        "  \"snapshot\": \"{}\",\n  \"device\": {},\n  \"ops\": {},\n  \"streams\": {},\n",
        json_escape(o.snapshot), o.device, trace.ops.size(), trace.streams);
    js << fmt::format("  \"initial_segments\": {},\n", trace.initial.size());
    js << fmt::format(
        "  \"recorded\": {{\"allocator_settings\": \"{}\", \"peak_reserved_bytes\": {}, "
        "\"final_reserved_bytes\": {}, \"ooms\": {}, \"expandable_segments\": {}}},\n",
        json_escape(snap.settings.conf), recorded_peak(trace),
        trace.recorded_reserved.empty() ? trace.recorded_initial_reserved
                                        : trace.recorded_reserved.back(),
        trace.recorded_ooms, trace.recorded_expandable ? "true" : "false");
    js << "  \"runs\": [\n" << allocator_runs_json(runs) << "  ]\n}\n";
  });
  dir.write("timeseries.csv", [&](std::ostream& ts) {
    write_allocator_timeseries(ts, runs, {{"snapshot", &trace}});
  });
  // The program itself, for replaying it elsewhere (tools/torch_replay.py on a GPU).
  dir.write("ops.csv", [&](std::ostream& ops) {
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
  });
}

int run_replay(const ReplayCommandOptions& o, std::ostream& out, std::ostream& err) {
  if (o.cuda && !cuda_backend_built()) {
    err << "memsim replay: --backend cuda: " << cuda_device_problem() << "\n";
    return kExitConfigError;
  }
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
    const std::string root = binary_source_root();
    const std::string anchor =
        root.empty() ? std::string("memsim replay --gpu")
                     : (fs::path(root) / "experiments" / "memsim replay --gpu").string();
    const ConfigNode ref = ConfigNode::parse("gpu: '" + o.gpu + "'", anchor);
    gpu = load_gpu_spec(ConfigNode::load_file(resolve_config_path(ref["gpu"], o.gpu, "gpus")));
  } catch (const ConfigError& e) {
    err << "memsim replay: --gpu: " << e.what() << "\n";
    return kExitConfigError;
  }
  auto allocs = resolve_allocators(o, *snap);
  if (!allocs.ok()) {
    err << "memsim replay: " << allocs.error().message << "\n";
    return kExitConfigError;
  }
  const AllocTrace& t = *trace;
  const uint64_t peak = recorded_peak(t);
  out << fmt::format(
      "memsim replay: {} (device {}: {} ops, {} streams, {} segments live when "
      "recording began)\n",
      o.snapshot, o.device, t.ops.size(), t.streams, t.initial.size());
  out << fmt::format("recorded by PyTorch: peak reserved {}, final reserved {}{}{}\n",
                     human_bytes(peak),
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
  const bool limited = std::any_of(allocs->begin(), allocs->end(), [](const ReplayVariant& v) {
    return caching_allocators().find(v.name)->traits.pytorch_alloc_conf &&
           v.yaml.find("memory_limit:") != std::string::npos;
  });
  if (snap->settings.garbage_collection_threshold > 0 && !limited)
    out << "note: the recording set garbage_collection_threshold, which acts only under "
           "set_per_process_memory_fraction; the snapshot does not record the fraction, so "
           "torch_caching collected nothing: pass --set torch_caching.memory_limit=BYTES "
           "(fraction x device memory)\n";

  OutputDir dir(o.out_dir, "replay");  // checked (and locked) before the replays run
  std::vector<AllocatorRunRecord> runs;
  bool failed = false;
  for (const ReplayVariant& v : *allocs) {
    Result<AllocatorRunRecord> r =
        run_allocator(t, "snapshot", v.label, v.yaml, v.factory, gpu, o.min_capacity);
    if (!r.ok()) {
      err << "memsim replay: " << v.label << ": " << r.error().message << "\n";
      return kExitConfigError;
    }
    if (!r->outcome.error.empty() && !r->outcome.oom) failed = true;
    runs.push_back(std::move(*r));
  }
  out << format_allocator_table(runs, false, o.explain);

  write_outputs(dir, o, t, *snap, runs);
  std::string exported;
  if (!o.export_path.empty()) {
    // The replay under the recording's own kind of allocator (PyTorch's), else the first.
    auto it = std::find_if(allocs->begin(), allocs->end(), [](const ReplayVariant& v) {
      return caching_allocators().find(v.name)->traits.pytorch_alloc_conf;
    });
    const ReplayVariant& chosen = it != allocs->end() ? *it : allocs->front();
    Result<std::string> bytes = export_replay_snapshot(t, chosen.factory, gpu);
    if (!bytes.ok()) {
      err << "memsim replay: --export: " << bytes.error().message << "\n";
      return kExitRunFailure;
    }
    write_file_atomically(o.export_path, *bytes);
    exported = fmt::format(
        "exported {}'s replay as a snapshot: {} (open it in "
        "pytorch.org/memory_viz)",
        chosen.label, o.export_path);
  }
  if (o.cuda) {
    std::vector<std::pair<std::string, AllocatorFactory>> labelled;
    for (const ReplayVariant& v : *allocs) labelled.emplace_back(v.label, v.factory);
    const int rc = cuda_replay(t, labelled, gpu, dir, out, err);
    if (rc != 0) failed = true;
  }
  dir.add_note(
      run_plot_script("plot_allocators.py", dir, {}, {"allocators.png", "allocators.svg"}));
  dir.commit();
  out << dir.report();
  if (!exported.empty()) out << exported << "\n";
  return failed ? kExitRunFailure : 0;
}

}  // namespace

int run_replay_command(const ReplayCommandOptions& o, std::ostream& out, std::ostream& err) {
  try {
    return run_replay(o, out, err);
  } catch (const HostMemoryError& e) {
    err << e.what() << "\n";
  } catch (const std::bad_alloc&) {
    err << fmt::format("memsim: out of host memory while replaying {}\n", o.snapshot);
  }
  return kExitRunFailure;
}

}  // namespace memsim
