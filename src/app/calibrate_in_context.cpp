// `memsim calibrate --in-context`: the cost model re-fitted to calls measured inside real
// captures and strategy runs (calls.csv), the per-run comparison, and the GPU YAML.
#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <fstream>

#include "src/app/calibrate.h"
#include "src/app/in_context_fit.h"

namespace memsim {
namespace {

// The calls of `paths`, or nullopt with the reason on `err`.
std::optional<std::vector<CallSample>> read_calls(const std::vector<std::string>& paths,
                                                  const char* option, std::ostream& err) {
  std::vector<CallSample> samples;
  for (const std::string& path : paths) {
    auto r = read_call_samples(path);
    if (!r.ok()) {
      err << "memsim calibrate: " << r.error().message << "\n";
      return std::nullopt;
    }
    samples.insert(samples.end(), r->begin(), r->end());
  }
  if (samples.empty()) {
    err << "memsim calibrate: " << option << ": no calls in "
        << fmt::format("{}", fmt::join(paths, ", ")) << "\n";
    return std::nullopt;
  }
  return samples;
}

// The comments of the base file that stay true after a re-fit, one "base: " line each: all of
// the base's own lines (how it was made, its fit notes), and from earlier generations every line
// no in-context fit wrote (the isolated calibration's measurements and findings). Older
// in-context generations are dropped, their terms having been fitted again since, so the header
// does not grow with each re-fit. A comment line indented by three or more spaces continues the
// one before it.
std::vector<std::string> carried_header(std::istream& in) {
  std::vector<std::string> blocks;
  std::string line;
  while (std::getline(in, line) && line.rfind("#", 0) == 0) {
    const std::string text = line.substr(std::min<size_t>(line.size(), 2));
    const size_t start = text.find_first_not_of(' ');
    if (line.rfind("#   ", 0) == 0 && !blocks.empty()) {
      if (start != std::string::npos) blocks.back() += " " + text.substr(start);
    } else {
      blocks.push_back(text);
    }
  }
  std::vector<std::string> kept;
  const std::string prefix = "base: ";
  for (std::string b : blocks) {
    size_t depth = 0;
    for (; b.rfind(prefix, 0) == 0; ++depth) b.erase(0, prefix.size());
    const bool in_context = b.find("re-fitted in context by") != std::string::npos ||
                            b.rfind("finding: in-context fit", 0) == 0;
    // The cost formula is restated in the new file; the base's statement of it goes.
    if (b.rfind("Cost of one call", 0) == 0 || (in_context && depth > 0)) continue;
    kept.push_back(prefix + b);
  }
  return kept;
}

// The comments of the base file's cost lines ("  name: {...}  # comment"), by primitive: a
// primitive this fit leaves alone keeps its base term, and the comment on it stays true.
std::map<Primitive, std::string> cost_comments(std::istream& in) {
  std::map<Primitive, std::string> notes;
  std::string line;
  bool costs = false;
  while (std::getline(in, line)) {
    if (line.rfind("#", 0) == 0) continue;
    if (line.rfind("  ", 0) != 0) {
      costs = line.rfind("costs:", 0) == 0;
      continue;
    }
    const size_t colon = line.find(':'), brace = line.find('}');
    if (!costs || colon == std::string::npos || brace == std::string::npos) continue;
    const size_t hash = line.find('#', brace);
    if (hash == std::string::npos) continue;
    const Primitive p = primitive_named(line.substr(2, colon - 2));
    const size_t text = line.find_first_not_of(' ', hash + 1);
    if (p != Primitive::kCount && text != std::string::npos) notes[p] = line.substr(text);
  }
  return notes;
}

}  // namespace

int run_calibrate_check(const CalibrateOptions& o, std::ostream& out, std::ostream& err) {
  const std::optional<GpuSpec> base = load_base_gpu(o.gpu_path, err);
  if (!base) return 2;
  int all_counted = 0, all_within = 0;
  std::vector<std::vector<InContextClass>> runs;
  for (const std::string& path : o.check) {
    const auto samples = read_calls({path}, "--check", err);
    if (!samples) return 2;
    out << fmt::format("\n{} against {}:\n{:<26} {:<18} {:>7} {:>11} {:>11} {:>7}\n", path,
                       o.gpu_path, "run", "primitive", "calls", "measured", "model", "ratio");
    int counted = 0, within = 0;
    std::vector<double> ratios;
    runs.push_back(compare_classes(*samples, *base, *base));
    for (const InContextClass& k : runs.back()) {
      const double r = k.base_us > 0 ? k.measured_us / k.base_us : 0;
      const bool many = k.calls > 10 && in_per_call_table(k.p), in = r >= 0.75 && r <= 1.25;
      counted += many;
      within += many && in;
      if (many) ratios.push_back(r);
      out << fmt::format("{:<26} {:<18} {:>7} {:>9.2f}us {:>9.2f}us {:>7.2f}{}\n", k.run,
                         to_string(k.p), k.calls, k.measured_us, k.base_us, r,
                         !many ? ""
                         : in  ? "  within"
                               : "  OUT");
    }
    out << fmt::format(
        "{}: {} of {} classes of the --backend cuda table (run, primitive; more than 10 calls) "
        "within 25%\n",
        path, within, counted);
    out << common_factor_line(ratios);
    all_counted += counted;
    all_within += within;
  }
  out << fmt::format("all files: {} of {} classes within 25%\n", all_within, all_counted);
  if (runs.size() > 1) {
    const PerCallRuns s = compare_runs(runs);
    const std::string reach =
        s.beyond_reach.empty() ? ""
                               : fmt::format(" (no model puts these within 25% of every run: {})",
                                             fmt::join(s.beyond_reach, ", "));
    const std::string outside =
        s.pooled_out.empty() ? "" : fmt::format("; outside: {}", fmt::join(s.pooled_out, ", "));
    out << fmt::format(
        "\nthe {} files as runs of one workload ({} classes):\n"
        "  within 25% of the model, per run:                     {}\n"
        "  within 25% of their own median over the runs, per run: {}  (the runs' spread)\n"
        "  slowest run more than 5/3 of the fastest: {}{}\n"
        "  calls pooled over the runs: {} of {} within 25%{}\n",
        runs.size(), s.classes, fmt::join(s.within, ", "), fmt::join(s.within_median, ", "),
        s.beyond_reach.size(), reach, s.pooled_within, s.classes, outside);
  }
  return 0;
}

int run_calibrate_in_context(const CalibrateOptions& o, std::ostream& out, std::ostream& err) {
  const std::optional<GpuSpec> loaded = load_base_gpu(o.gpu_path, err);
  if (!loaded) return 2;
  const GpuSpec& base = *loaded;
  const auto read = read_calls(o.in_context, "--in-context", err);
  if (!read) return 2;
  const std::vector<CallSample>& samples = *read;
  const InContextFit fit = fit_in_context(samples, base);
  for (const std::string& n : fit.notes) out << "fit " << n << "\n";
  out << fmt::format("\n{:<26} {:<18} {:>7} {:>11} {:>11} {:>11} {:>7} {:>7}\n", "run", "primitive",
                     "calls", "measured", "base", "fitted", "m/base", "m/fit");
  int counted = 0, within = 0;
  for (const InContextClass& k : fit.classes) {
    const double rb = k.base_us > 0 ? k.measured_us / k.base_us : 0;
    const double rf = k.fitted_us > 0 ? k.measured_us / k.fitted_us : 0;
    const bool many = k.calls > 10, in = rf >= 0.75 && rf <= 1.25;
    counted += many;
    within += many && in;
    out << fmt::format("{:<26} {:<18} {:>7} {:>9.2f}us {:>9.2f}us {:>9.2f}us {:>7.2f} {:>7.2f}{}\n",
                       k.run, to_string(k.p), k.calls, k.measured_us, k.base_us, k.fitted_us, rb,
                       rf, many && !in ? "  OUT" : "");
  }
  out << fmt::format(
      "{} of {} (run, primitive) classes of more than 10 calls within 25% of the "
      "fitted model\n",
      within, counted);

  Calibration c;
  c.base = base;
  c.spec = fit.spec;
  for (const std::string& n : fit.notes) c.findings.push_back("in-context fit " + n);
  // Per fitted primitive: mean measured and fitted time per call (comments on its cost line).
  for (size_t i = 0; i < size_t(Primitive::kCount); ++i) {
    CalibrationRow row;
    row.p = Primitive(i);
    double measured = 0, fitted = 0;
    for (const InContextClass& k : fit.classes)
      if (k.p == row.p) {
        row.samples += k.calls;
        measured += k.measured_us * double(k.calls);
        fitted += k.fitted_us * double(k.calls);
      }
    if (row.samples < 10 || row.p == Primitive::kFill || row.p == Primitive::kCopy) continue;
    row.what = fmt::format("in context, {} calls: mean", row.samples);
    row.median_us = measured / double(row.samples);
    row.model_us = fitted / double(row.samples);
    c.rows.push_back(row);
  }
  // The base file's own comments (its isolated calibration and findings) carry over.
  std::vector<std::string> header = {fmt::format(
      "{} re-fitted in context by `memsim calibrate --in-context {}` over {}, {}: {} real calls "
      "measured inside captures and strategy runs (--backend cuda); fill, copy and primitives "
      "with fewer than 10 calls keep the base's terms.",
      base.name, fmt::join(o.in_context, " "), o.gpu_path, "DATE", samples.size())};
  {
    std::ifstream in(o.gpu_path);
    for (std::string& h : carried_header(in)) header.push_back(std::move(h));
    in.clear();
    in.seekg(0);
    c.cost_notes = cost_comments(in);
  }
  const std::string out_path =
      o.out_path.empty() ? fmt::format("configs/gpus/{}.calibrated.yaml", base.name) : o.out_path;
  char date[32] = "";
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const auto at = header[0].find("DATE");
  header[0].replace(at, 4, date);
  return write_gpu_yaml(c, header, out_path, out, err) ? 0 : 1;
}

}  // namespace memsim
