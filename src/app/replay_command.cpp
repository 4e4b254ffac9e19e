// memsim replay: snapshot -> allocation trace -> one replay per allocator -> reports.
#include "src/app/replay_command.h"

#include <filesystem>
#include <new>
#include <ostream>

#include <fmt/format.h>

#include "memsim_config.h"
#include "core/host_memory.h"
#include "src/drivers/trace_recorder.h"
#include "src/drivers/trace_replay.h"
#include "workload/alloc_trace.h"
#include "workload/snapshot.h"
#include "src/alloc/registry.h"
#include "src/app/allocator_reports.h"
#include "src/app/cuda_modes.h"
#include "src/app/output.h"
#include "src/app/plots.h"
#include "src/app/writers.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"

namespace memsim {

namespace fs = std::filesystem;

namespace {

constexpr int kExitRunFailure = 1;
constexpr int kExitConfigError = 2;

// The allocators' YAML: those configured by PyTorch's settings (torch_caching) start from the
// snapshot's own, the others from their defaults; --set NAME.key=value overrides go on top and
// are validated like any config.
Result<std::vector<std::pair<std::string, AllocatorFactory>>> resolve_allocators(
    const ReplayCommandOptions& o, const Snapshot& snap, std::vector<std::string>* yaml_out) {
  std::vector<std::string> names = o.allocators;
  const Registry<AllocatorEntry>& registry = caching_allocators();
  if (names.empty()) names = registry.names();
  std::string doc = "allocators:\n";
  for (const std::string& n : names) {
    const AllocatorEntry* info = registry.find(n);
    if (info == nullptr)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("--allocator {}: {}", n, registry.unknown(n)));
    doc += fmt::format("  {}: {}\n", n,
                       info->traits.pytorch_alloc_conf ? torch_caching_yaml(snap.settings) : "{}");
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
      const AllocatorEntry* info = registry.find(n);
      node.expect_keys(info->keys);
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
  std::vector<std::string> yamls;
  auto allocs = resolve_allocators(o, *snap, &yamls);
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
  if (snap->settings.garbage_collection_threshold > 0 &&
      std::none_of(o.overrides.begin(), o.overrides.end(), [](const std::string& a) {
        return a.rfind("torch_caching.memory_limit=", 0) == 0;
      }))
    out << "note: the recording set garbage_collection_threshold, which acts only under "
           "set_per_process_memory_fraction; the snapshot does not record the fraction, so "
           "torch_caching collected nothing: pass --set torch_caching.memory_limit=BYTES "
           "(fraction x device memory)\n";

  OutputDir dir(o.out_dir, "replay");  // checked (and locked) before the replays run
  std::vector<AllocatorRunRecord> runs;
  bool failed = false;
  for (size_t k = 0; k < allocs->size(); ++k) {
    const auto& [name, factory] = (*allocs)[k];
    Result<AllocatorRunRecord> r =
        run_allocator(t, "snapshot", name, yamls[k], factory, gpu, o.min_capacity);
    if (!r.ok()) {
      err << "memsim replay: " << name << ": " << r.error().message << "\n";
      return kExitConfigError;
    }
    if (!r->outcome.error.empty() && !r->outcome.oom) failed = true;
    runs.push_back(std::move(*r));
  }
  out << format_allocator_table(runs, false);

  write_outputs(dir, o, t, *snap, runs);
  std::string exported;
  if (!o.export_path.empty()) {
    // The replay under the recording's own kind of allocator (PyTorch's), else the first.
    auto it = std::find_if(allocs->begin(), allocs->end(), [](const auto& a) {
      return caching_allocators().find(a.first)->traits.pytorch_alloc_conf;
    });
    const auto& factory = it != allocs->end() ? it->second : allocs->front().second;
    Result<std::string> bytes = export_replay_snapshot(t, factory, gpu);
    if (!bytes.ok()) {
      err << "memsim replay: --export: " << bytes.error().message << "\n";
      return kExitRunFailure;
    }
    write_file_atomically(o.export_path, *bytes);
    exported = fmt::format(
        "exported {}'s replay as a snapshot: {} (open it in "
        "pytorch.org/memory_viz)",
        it != allocs->end() ? it->first : allocs->front().first, o.export_path);
  }
  if (o.cuda) {
    const int rc = cuda_replay(t, *allocs, gpu, dir, out, err);
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
