// The GPU YAML of a calibration (format, write with read-back, the base spec) and the table of
// its measurements; no CUDA here, so fits from calls.csv files run in every build.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/app/calibrate.h"
#include "src/app/output.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"

namespace memsim {
namespace {

using P = Primitive;
constexpr uint64_t kKiB = 1ull << 10, kMiB = 1ull << 20, kGiB = 1ull << 30, kTiB = 1ull << 40;

// Six significant digits, never in exponent form (YAML readers and humans both like that).
std::string num(double v) {
  if (v == 0) return "0.0";
  const int digits = 5 - static_cast<int>(std::floor(std::log10(std::fabs(v))));
  std::string s = fmt::format("{:.{}f}", v, std::clamp(digits, 1, 9));
  while (s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
  return s;
}

std::string us_str(double v) {
  return fmt::format("{:.{}f}", v, v >= 100 ? 0 : v >= 10 ? 1 : 2);
}

// The graphs: section of a spec, as YAML keys and values.
std::vector<std::pair<const char*, double>> graph_terms(const GpuSpec& s) {
  return {{"capture_per_node_us", s.capture_per_node_us},
          {"instantiate_per_node_us", s.instantiate_per_node_us},
          {"upload_per_node_us", s.upload_per_node_us},
          {"mem_map_per_granule_us", s.graph_mem_map_per_granule_us},
          {"mem_remap_per_granule_us", s.graph_mem_remap_per_granule_us}};
}

// Appends `text` as comment lines of at most ~100 columns.
void comment(std::ostringstream& o, const std::string& text) {
  std::istringstream words(text);
  std::string line = "#", w;
  while (words >> w) {
    if (line.size() + w.size() > 98 && line.size() > 1) {
      o << line << "\n";
      line = "#    ";
    }
    line += " " + w;
  }
  o << line << "\n";
}

// "per_call_us: 12.0, per_granule_us: 0.057" (the non-zero fields of a term).
std::string term_str(const CostTerm& t) {
  std::vector<std::string> kv;
  const std::pair<const char*, double> fields[] = {
      {"per_call_us", t.per_call_us},
      {"per_handle_us", t.per_handle_us},
      {"per_granule_us", t.per_granule_us},
      {"bytes_per_us", t.bytes_per_us},
      {"per_log2_mappings_us", t.per_log2_mappings_us},
      {"first_after_launch_us", t.first_after_launch_us}};
  for (const auto& [k, v] : fields)
    if (v != 0) kv.push_back(fmt::format("{}: {}", k, num(v)));
  return kv.empty() ? "per_call_us: 0.0" : fmt::format("{}", fmt::join(kv, ", "));
}

}  // namespace

std::string yaml_bytes(uint64_t b) {
  const std::pair<uint64_t, const char*> units[] = {
      {kTiB, "TiB"}, {kGiB, "GiB"}, {kMiB, "MiB"}, {kKiB, "KiB"}};
  for (const auto& [u, name] : units)
    if (b >= u && b % u == 0) return fmt::format("{}{}", b / u, name);
  return std::to_string(b);
}

std::string format_calibration_table(const Calibration& c) {
  std::ostringstream o;
  o << fmt::format("{:<18} {:<40} {:>5} {:>10} {:>19} {:>10} {:>7}\n", "primitive", "shape",
                   "calls", "median us", "p10..p90 us", "model us", "dev");
  for (const CalibrationRow& r : c.rows) {
    std::string model = "-", dev;
    if (r.model_us >= 0) {
      model = fmt::format("{:.2f}", r.model_us);
      const double d = r.median_us > 0 ? (r.model_us - r.median_us) / r.median_us : 0.0;
      dev = fmt::format("{:+.0f}%", 100 * d);
      if (std::fabs(d) > 0.25 && std::fabs(r.model_us - r.median_us) > 2.0) dev += " !";
    }
    o << fmt::format("{:<18} {:<40} {:>5} {:>10.2f} {:>19} {:>10} {:>7}\n", to_string(r.p), r.what,
                     r.samples, r.median_us, fmt::format("{:.2f}..{:.2f}", r.p10_us, r.p90_us),
                     model, dev);
  }
  o << "(model: the fitted cost of that call; '!': off by more than 25% and 2 us)\n\n";
  o << "fitted terms (base -> calibrated):\n";
  const auto gb = graph_terms(c.base), gs = graph_terms(c.spec);
  for (size_t i = 0; i < gs.size(); ++i)
    o << fmt::format("  graphs.{:<25} {} -> {}\n", gs[i].first, num(gb[i].second),
                     num(gs[i].second));
  for (size_t i = 0; i < static_cast<size_t>(P::kCount); ++i)
    o << fmt::format("  {:<18} {{{}}} -> {{{}}}\n", to_string(static_cast<P>(i)),
                     term_str(c.base.costs[i]), term_str(c.spec.costs[i]));
  for (const std::string& f : c.findings) o << "finding: " << f << "\n";
  for (const std::string& f : c.failures) o << "FAILED: " << f << "\n";
  return o.str();
}

std::string format_gpu_yaml(const Calibration& c, const std::vector<std::string>& header) {
  const GpuSpec& s = c.spec;
  std::ostringstream o;
  for (const std::string& h : header) comment(o, h);
  if (!c.rows.empty())
    o << "# Cost of one call = per_call_us + per_handle_us x handles + per_granule_us x (bytes /\n"
         "#   granularity) + bytes / bytes_per_us (copy: 2 x bytes) + per_log2_mappings_us x\n"
         "#   log2(1 + live VA mappings / va_mappings_knee) + first_after_launch_us (the first "
         "call\n"
         "#   of its primitive since a graph launch). Comments: what was measured.\n";
  for (const std::string& f : c.failures) comment(o, "FAILED, base values kept: " + f);
  for (const std::string& f : c.findings) comment(o, "finding: " + f);
  o << "name: " << s.name << "\n";
  o << "capacity: " << yaml_bytes(s.capacity) << "\n";
  o << "context: " << s.context
    << "    # bytes not free at start (CUDA context; tools/repro/context_memory.cu)\n";
  o << "granularity: " << yaml_bytes(s.granularity) << "\n";
  o << "va_space: " << yaml_bytes(s.va_space) << "\n";
  if (s.va_mappings_knee != 1)
    o << "va_mappings_knee: " << num(s.va_mappings_knee)
      << "    # per_log2_mappings terms: log2(1 + live VA mappings / knee)\n";
  o << "graphs:\n";
  for (const auto& [k, v] : graph_terms(s)) o << "  " << k << ": " << num(v) << "\n";
  if (s.graph_mem_chunk)  // probed with memsim-graphmem-probe, carried over from the base spec
    o << "  mem_chunk: " << (s.graph_mem_chunk >> 20) << "MiB\n";
  o << "costs:\n";
  for (size_t i = 0; i < static_cast<size_t>(P::kCount); ++i) {
    const auto p = static_cast<P>(i);
    std::string line = fmt::format("  {}: {{{}}}", to_string(p), term_str(s.cost(p)));
    std::vector<std::string> seen;
    for (const CalibrationRow& r : c.rows)
      if (r.p == p && r.model_us >= 0 && r.what.find("captured") == std::string::npos)
        seen.push_back(fmt::format("{} {} us", r.what, us_str(r.median_us)));
    if (!seen.empty()) {
      line = fmt::format("{:<76} # {}", line, fmt::join(seen, "; "));
    } else if (const auto note = c.cost_notes.find(p); note != c.cost_notes.end()) {
      line = fmt::format("{:<76} # {}", line, note->second);
    }
    o << line << "\n";
  }
  o << format_compute_yaml(s.compute);  // not measured by calibrate: carried over
  return o.str();
}

std::optional<GpuSpec> load_base_gpu(const std::string& path, std::ostream& err) {
  try {
    return load_gpu_spec(ConfigNode::load_file(path));
  } catch (const ConfigError& e) {
    err << "memsim calibrate: config error: " << e.what() << "\n";
    return std::nullopt;
  }
}

bool write_gpu_yaml(const Calibration& c, const std::vector<std::string>& header,
                    const std::string& out_path, std::ostream& out, std::ostream& err) {
  const std::filesystem::path path(out_path);
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  // The text must load as an experiment would load it, with the fitted values, before it
  // replaces anything: --out may be the very file --gpu was read from.
  const auto loads_back = [&](std::string_view text) -> std::string {
    try {
      Calibration back, want;
      back.spec = load_gpu_spec(ConfigNode::parse(std::string(text), out_path));
      want.spec = c.spec;
      if (format_gpu_yaml(back, {}) == format_gpu_yaml(want, {})) return {};
      return "the values read back differ from the fitted ones";
    } catch (const std::exception& e) {  // ConfigError, or anything yaml-cpp throws
      return fmt::format("it does not load as a GPU spec: {}", e.what());
    }
  };
  try {
    write_file_atomically(out_path, format_gpu_yaml(c, header), loads_back);
  } catch (const OutputError& e) {
    err << "memsim calibrate: ERROR: " << e.what() << "\n";
    return false;
  }
  out << fmt::format("wrote {} (read back with load_gpu_spec: ok)\n", out_path);
  return true;
}

}  // namespace memsim
