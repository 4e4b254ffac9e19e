// Writers: tables for people, JSON/CSV for tools, plots through tools/plot_shapes.py.
#include "src/app/writers.h"
#include "src/app/plots.h"

#include <fmt/format.h>
#include <filesystem>
#include <ostream>

namespace memsim {
namespace fs = std::filesystem;

std::string human_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 40)) return fmt::format("{:.2f} TiB", b / (1ull << 40));
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / (1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f} MiB", b / (1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.1f} KiB", b / (1ull << 10));
  return fmt::format("{} B", bytes);
}

namespace {

double ratio(uint64_t a, uint64_t b) {
  return b ? static_cast<double>(a) / b : 0.0;
}
double us(SimTime t) {
  return static_cast<double>(t) / 1000.0;
}

std::string outcome(const CaptureRunResult& r) {
  if (r.out_of_memory)
    return fmt::format("OOM at b={} ({} short)", r.failed_batch, human_bytes(r.bytes_short));
  if (!r.ok) return "error: " + r.failure;
  if (!r.invariant_violation.empty()) return "VIOLATION";
  if (!r.held_outputs_preserved) return "ok (held outputs aliased)";
  return "ok";
}

constexpr ColumnDoc kShapesColumns[] = {
    {"strategy", "the run's label (default: impl, plus /large_first etc. for its options)", -26},
    {"peak phys",
     "peak physical bytes the backend held, each physical allocation counted once however many "
     "VA ranges map it",
     12},
    {"peak virt",
     "peak bytes of virtual address space mapped to physical memory (reserved but unmapped VA "
     "not counted)",
     12},
    {"/max", "peak phys / max(shape): each capture size captured alone in a fresh private pool", 8},
    {"/sum", "peak phys / sum(shape) of those standalone peaks", 8},
    {"capture ms",
     "simulated ms from each graph's begin_graph through end_capture and its warm-up launch, "
     "summed; includes switch ms",
     12},
    {"switch ms", "simulated ms the strategy spent preparing captures (vmm_alias's VA switches)",
     10},
    {"outcome",
     "ok; ok (held outputs aliased); OOM at b=B (N short); error: ...; VIOLATION (an invariant "
     "check failed)"},
};

const StandaloneRef& reference_of(const ShapesResults& res, const Variant& v) {
  for (const auto& [var, ref] : res.references)
    if (var == v) return ref;
  return res.references.front().second;
}

}  // namespace

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20)
          out += fmt::format("\\u{:04x}", ch);
        else
          out += ch;
    }
  }
  return out;
}

std::span<const ColumnDoc> shapes_columns() {
  return kShapesColumns;
}

std::string format_shapes_table(const ShapesConfig& c, const ShapesResults& res, bool explain) {
  std::string out;
  const StandaloneRef& ref = reference_of(res, c.table);
  out += fmt::format("memsim shapes: {} on {} ({} capture sizes {}..{}), variant {}\n",
                     c.model.name, c.gpu.name, c.capture_sizes.size(), c.capture_sizes.front(),
                     c.capture_sizes.back(), c.table.name());
  out += fmt::format(
      "weights {} stay on the device while the graphs are captured: graph memory has the other "
      "{} (the figures below are graph memory alone)\n",
      human_bytes(c.model.weight_bytes()), human_bytes(c.gpu.capacity - c.model.weight_bytes()));
  out += fmt::format(
      "standalone footprints (each shape alone, fresh private pool): max(shape) "
      "= {}, sum(shape) = {}\n\n",
      human_bytes(ref.max), human_bytes(ref.sum));
  out += header_row(kShapesColumns);
  for (const RunRecord& r : res.runs) {
    if (!(r.variant == c.table)) continue;
    const CaptureRunResult& x = r.result;
    out += fmt::format("{:<26} {:>12} {:>12} {:>8.3f} {:>8.3f} {:>12.2f} {:>10.2f}  {}\n",
                       r.strategy->label, human_bytes(x.peak_physical),
                       human_bytes(x.peak_virtual_mapped), ratio(x.peak_physical, r.reference_max),
                       ratio(x.peak_physical, r.reference_sum), us(x.capture_time) / 1000.0,
                       us(x.switch_time) / 1000.0, outcome(x));
  }
  out += table_legend(kShapesColumns, kShapesAnchor, explain);
  out += "\npeak physical / max(shape), every variant (outputs/arrival/graphs/inputs):\n";
  out += fmt::format("{:<36}", "variant");
  for (const StrategySpec& s : c.strategies) out += fmt::format(" {:>14.14}", s.label);
  out += "\n";
  for (const Variant& v : c.variants) {
    out += fmt::format("{:<36}", v.name());
    for (const RunRecord& r : res.runs) {
      if (!(r.variant == v)) continue;
      const bool bad = !r.result.ok || !r.result.invariant_violation.empty();
      out += bad ? fmt::format(" {:>14}", r.result.out_of_memory ? "OOM" : "ERR")
                 : fmt::format(" {:>14.3f}", ratio(r.result.peak_physical, r.reference_max));
    }
    out += "\n";
  }
  size_t violations = 0;
  for (const RunRecord& r : res.runs) violations += !r.result.invariant_violation.empty();
  out += fmt::format("\n{} runs in {:.3f} s wall; {} invariant violation(s)\n", res.runs.size(),
                     res.wall_seconds, violations);
  for (const RunRecord& r : res.runs)
    if (!r.result.invariant_violation.empty())
      out += fmt::format("  {} [{}]: {}\n", r.strategy->label, r.variant.name(),
                         r.result.invariant_violation);
  return out;
}

namespace {

// summary.json: the config's identity, the standalone references and one record per run.
void write_summary_json(std::ostream& js, const ShapesConfig& c, const ShapesResults& res) {
  js << "{\n";
  js << fmt::format("  \"experiment\": \"{}\",\n  \"config\": \"{}\",\n", c.experiment,
                    json_escape(c.source));
  js << fmt::format("  \"gpu\": \"{}\",\n  \"model\": \"{}\",\n  \"seed\": {},\n",
                    json_escape(c.gpu.name), json_escape(c.model.name), c.seed);
  js << fmt::format("  \"capture_sizes\": [{}],\n", fmt::join(c.capture_sizes, ", "));
  js << fmt::format("  \"table_variant\": \"{}\",\n", c.table.name());
  js << "  \"references\": [\n";
  for (size_t i = 0; i < res.references.size(); ++i) {
    const auto& [v, ref] = res.references[i];
    js << fmt::format(
        "    {{\"variant\": \"{}\", \"max_shape_bytes\": {}, \"sum_shape_bytes\": {}, "
        "\"standalone\": [",
        v.name(), ref.max, ref.sum);
    for (size_t k = 0; k < ref.per_shape.size(); ++k)
      js << fmt::format("{}{{\"batch\": {}, \"bytes\": {}}}", k ? ", " : "", ref.per_shape[k].first,
                        ref.per_shape[k].second);
    js << (i + 1 < res.references.size() ? "]},\n" : "]}\n");
  }
  js << "  ],\n  \"runs\": [\n";
  for (size_t i = 0; i < res.runs.size(); ++i) {
    const RunRecord& r = res.runs[i];
    const CaptureRunResult& x = r.result;
    js << fmt::format(
        "    {{\"strategy\": \"{}\", \"impl\": \"{}\", \"order\": \"{}\", \"variant\": \"{}\", "
        "\"outputs\": \"{}\", \"arrival\": \"{}\", \"graphs\": \"{}\", \"inputs\": \"{}\", "
        "\"peak_physical_bytes\": {}, \"peak_virtual_mapped_bytes\": {}, "
        "\"peak_virtual_reserved_bytes\": {}, \"peak_strategy_bytes\": {}, "
        "\"max_shape_bytes\": {}, \"sum_shape_bytes\": {}, \"own_max_shape_bytes\": {}, "
        "\"ratio_to_max\": {:.6f}, \"ratio_to_sum\": {:.6f}, \"capture_time_us\": {:.3f}, "
        "\"switch_time_us\": {:.3f}, \"input_update_time_us\": {:.3f}, "
        "\"input_update_bytes\": {}, \"end_time_us\": {:.3f}, \"shapes_captured\": {}, "
        "\"graphs\": {}, \"launches\": {}, \"outcome\": \"{}\", \"out_of_memory\": {}, "
        "\"failed_batch\": {}, \"bytes_short\": {}, \"invariant_violation\": \"{}\", "
        "\"released_all\": {}, \"held_outputs_preserved\": {}}}{}\n",
        json_escape(r.strategy->label), r.strategy->impl, to_string(r.strategy->order),
        r.variant.name(), to_string(r.variant.outputs), to_string(r.variant.arrival),
        to_string(r.variant.graphs), to_string(r.variant.inputs), x.peak_physical,
        x.peak_virtual_mapped, x.peak_virtual_reserved, x.peak_strategy_reserved, r.reference_max,
        r.reference_sum, r.own_max, ratio(x.peak_physical, r.reference_max),
        ratio(x.peak_physical, r.reference_sum), us(x.capture_time), us(x.switch_time),
        us(x.input_update_time), x.input_update_bytes, us(x.end_time), x.shapes_captured, x.graphs,
        x.launches, json_escape(outcome(x)), x.out_of_memory, x.failed_batch, x.bytes_short,
        json_escape(x.invariant_violation), x.released_all, x.held_outputs_preserved,
        i + 1 < res.runs.size() ? "," : "");
  }
  js << "  ]\n}\n";
}

}  // namespace

void write_shapes_outputs(const ShapesConfig& c, const ShapesResults& res, OutputDir& dir) {
  if (!res.snapshots.empty()) {
    std::error_code ec;
    fs::create_directories(dir.staged("snapshots"), ec);
    if (ec)
      throw OutputError(fmt::format("cannot create {}/snapshots: {}", dir.path(), ec.message()));
    for (const auto& [label, bytes] : res.snapshots) {
      std::string name = label;
      std::replace(name.begin(), name.end(), '/', '_');
      dir.write("snapshots/" + name + ".pickle", bytes);
    }
  }
  dir.write("summary.json", [&](std::ostream& js) { write_summary_json(js, c, res); });
  dir.write("curves.csv", [&](std::ostream& cv) {
    cv << "variant,strategy,shapes_captured,batch,time_us,physical_bytes,virtual_bytes,"
          "strategy_bytes\n";
    for (const RunRecord& r : res.runs)
      for (const CurvePoint& p : r.result.curve)
        cv << fmt::format("{},{},{},{},{:.3f},{},{},{}\n", csv_cell(r.variant.name()),
                          csv_cell(r.strategy->label), p.shapes_captured, p.batch, us(p.time),
                          p.physical, p.virtual_mapped, p.strategy_reserved);
  });
  dir.write("timeseries.csv", [&](std::ostream& ts) {
    ts << "time_us,strategy,variant,metric,value\n";
    for (const TimeseriesRow& row : res.timeseries) {
      const RunRecord& r = res.runs[row.run];
      ts << fmt::format("{:.3f},{},{},{},{}\n", us(row.time), csv_cell(r.strategy->label),
                        csv_cell(r.variant.name()), row.metric, row.value);
    }
  });
}

std::string binary_source_root() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : (exe.parent_path() / "..").string();
}

std::string plot_shapes(const ShapesConfig& c, const OutputDir& dir) {
  return run_plot_script("plot_shapes.py", dir, {"--variant", c.table.name()},
                         {"footprint.png", "footprint.svg"});
}

}  // namespace memsim
