// memsim-model-bench --replay-steps: a serving run's measured steps timed again in isolation,
// with the step-time model's prediction and the served time beside each, by class and size.
#include "bench/step_replay.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "bench/bench_cli.h"
#include "src/app/output.h"
#include "workload/measured_steps.h"

namespace memsim::bench {
namespace {

const char* step_class(const StepShape& s) {
  return s.decode_seqs == s.num_seqs ? "decode" : s.decode_seqs ? "mixed" : "prefill";
}

// The band of a step's prefill tokens the summary groups it by.
std::string prefill_band(uint64_t tokens) {
  for (uint64_t edge : {16, 64, 256, 1024, 4096})
    if (tokens <= edge) return fmt::format("<= {}", edge);
  return "> 4096";
}

struct Sums {
  uint32_t n = 0;
  double measured = 0, predicted = 0, isolated = 0;
  void add(const MeasuredStepRow& r, double iso) {
    ++n;
    measured += r.measured_ms;
    predicted += r.predicted_ms;
    isolated += iso;
  }
};

void print_sums(const std::string& what, const Sums& s) {
  std::printf("%-26s %6u %12.1f %12.1f %12.1f %10.3f %10.3f\n", what.c_str(), s.n, s.measured,
              s.predicted, s.isolated, s.predicted / s.isolated, s.isolated / s.measured);
}

// Writes `text` to `path` through a temporary file renamed over it; false when any step fails.
bool write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

}  // namespace

void ReplayOptions::add_options(CLI::App& app) {
  app.add_option("--replay-steps", steps_csv,
                 "time the steps of a serving run's steps.csv again, one by one in isolation "
                 "(eager, as calibrate times its grid), beside their served and predicted times")
      ->check(CLI::ExistingFile);
  app.add_option("--replay-out", out_csv, "write the replayed steps with their isolated times");
  app.add_option("--replay-classes", classes, "step classes to replay: mixed, prefill, decode")
      ->delimiter(',')
      ->check(CLI::IsMember({"mixed", "prefill", "decode"}));
  app.add_option("--replay-limit", limit, "replay the first N steps of those classes (0: all)");
}

int replay_steps(ModelStep& step, Backend& backend, const ProfileGrid& grid,
                 const ReplayOptions& o) {
  auto rows = read_steps_csv(o.steps_csv);
  if (!rows.ok()) {
    std::fprintf(stderr, "memsim-model-bench: %s\n", rows.error().message.c_str());
    return kExitBadInput;
  }
  std::vector<MeasuredStepRow> picked;
  std::vector<std::vector<SeqWork>> steps;
  for (const MeasuredStepRow& r : *rows) {
    if (o.limit && picked.size() == o.limit) break;
    if (std::find(o.classes.begin(), o.classes.end(), step_class(r.shape)) == o.classes.end())
      continue;
    auto seqs = sequences_of(r.shape);
    if (!seqs.ok()) {
      std::fprintf(stderr, "memsim-model-bench: %s: run '%s' step %llu: %s\n", o.steps_csv.c_str(),
                   r.run.c_str(), static_cast<unsigned long long>(r.step),
                   seqs.error().message.c_str());
      return kExitBadInput;
    }
    picked.push_back(r);
    steps.push_back(std::move(seqs).value());
  }
  if (picked.empty()) {
    std::fprintf(stderr, "memsim-model-bench: %s: no step of the classes asked for\n",
                 o.steps_csv.c_str());
    return kExitBadInput;
  }
  std::ostringstream log;
  auto ms = measure_steps(step, backend, grid, steps, log);
  if (!ms.ok()) {
    std::fprintf(stderr, "memsim-model-bench: replay: %s\n", ms.error().message.c_str());
    return ms.error().code == ErrorCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  std::ostringstream csv;
  csv << "run,step,class,num_seqs,new_tokens,decode_seqs,decode_kv_tokens,prefill_tokens,"
         "prefill_prefix,measured_ms,predicted_ms,gpu_ms,isolated_ms\n";
  std::map<std::string, Sums> by_class;
  std::map<std::pair<std::string, std::string>, Sums> by_band;
  for (size_t i = 0; i < picked.size(); ++i) {
    const MeasuredStepRow& r = picked[i];
    const StepShape& s = r.shape;
    uint64_t prefill = 0, prefix = 0;
    for (size_t j = s.decode_seqs; j < steps[i].size(); ++j) {  // decodes come first
      prefill += steps[i][j].tokens;
      prefix += steps[i][j].cached;
    }
    csv << fmt::format("{},{},{},{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f}\n",
                       csv_quoted(r.run), r.step, step_class(s), s.num_seqs, s.new_tokens,
                       s.decode_seqs, s.decode_kv_tokens, prefill, prefix, r.measured_ms,
                       r.predicted_ms, r.gpu_ms, (*ms)[i]);
    by_class[step_class(s)].add(r, (*ms)[i]);
    by_band[{step_class(s), prefill_band(s.new_tokens - s.decode_seqs)}].add(r, (*ms)[i]);
  }
  std::printf("replayed %zu steps of %s in isolation (eager, median of %u after one)\n",
              picked.size(), o.steps_csv.c_str(), grid.reps);
  std::printf("%-26s %6s %12s %12s %12s %10s %10s\n", "steps", "count", "served ms", "predicted ms",
              "isolated ms", "pred/iso", "iso/served");
  for (const auto& [c, s] : by_class) print_sums(c, s);
  for (const auto& [k, s] : by_band) print_sums(k.first + ", prefill " + k.second, s);
  if (!o.out_csv.empty() && !write_atomically(o.out_csv, csv.str())) {
    std::fprintf(stderr, "memsim-model-bench: cannot write %s\n", o.out_csv.c_str());
    return kExitFailure;
  }
  return 0;
}

}  // namespace memsim::bench
